import BackhaulCLI

await Backhaul.runFromCommandLine()
