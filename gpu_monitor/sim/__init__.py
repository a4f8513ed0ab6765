"""The simulated node: fakes at the lowest boundaries (NVML module, sysfs tree, kernel log,
external tools, device workers) so the real readers and checks run on a machine without GPUs."""
