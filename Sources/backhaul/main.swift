import BackhaulCLI

Backhaul.main()
