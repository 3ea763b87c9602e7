"""The machine a session runs on: what it can do, probed at run time and held against what this
build and hardware should have, and the facts of its CPU and GPU that decide behaviour.

Scenarios and teams reach it through its faces, `harness.lab.devices` (capabilities, the probed
device) and `harness.lab.hardware` (holding the CPU's kernels down, for the plugin).

- `capabilities`: what a capability is (`Capability`, `Expected`); the built-in ones, a row each;
- `probes`: what a probe saw (`Probe`), how one runs, and each built-in capability's probe;
- `device`: the probed device (`DeviceInfo`, `probe`, `resolve`), and why it lacks a need (`Lack`);
- `team`: a team's own capabilities, loaded from beside its scenarios;
- `cpu`: the CPU's facts, its class and the kernel levels in force, and holding them down;
- `levels`: the CPU kernel levels, lowest first, without torch (the reports order classes by them);
- `gpu`: a GPU's facts (NVML, cuBLAS), its class, its variant figures, native bfloat16;
- `gpus`: the GPU datasheet table (`gpus.json`), and which entry a device is.
"""
