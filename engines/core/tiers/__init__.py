"""KV tiers below the device pool (host memory, disk): the accounting the scheduler consults through its tiering
plug-in, one tier pool, and tiers modelled without bytes for the sim and zero runners. No torch, no I/O."""
