import BackhaulServer
import Glibc

exit(runBackhauld(arguments: Array(CommandLine.arguments.dropFirst())))
