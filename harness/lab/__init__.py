"""How AMP behaviour is measured: the instruments scenarios are written with.

Imports only harness.common. A scenario author's import surface is this package:
`from harness.lab import devices, models, probes, recipes, train` (docs/writing-a-scenario.md).

- precision and hardware: `recipes` (the unit of comparison), `tf32`, `devices` (capabilities
  probed at run time) and `hardware` (holding the CPU's kernels down): the faces of `machine/`,
  `formats`, `fp8` (the FP8 formats, scaled casts, an emulated FP8 Linear), `releases`
  (behaviour that changed between torch releases);
- workloads: `models`, `data`, `train` (the training loop), `loops` (loops of several shapes
  observed step by step, and a claim decided over them);
- instruments: `probes`, `measure` (timing and memory), `stats`, `memory_model`, `speedups`,
  `smoke`, `figures` (curves a scenario attaches to its record), `distributed` (gloo ranks);
- `machine/`: the machine (a package: capabilities, one row each; probes, device, team; the
  CPU's facts and levels, the GPU's facts and the datasheet table gpus);
- `diagnose/`: the pitfalls measured on a user's own model (a package: order, runs, observed,
  thresholds, curves, rules, wording, fixes, kernels, compiled, verify, examples);
- `known_bugs/`: the known-bug ledger's reproductions, a module a class of bug (each runs the
  code a bug is in and its control, and says whether the harm showed);
- `autocast/`: PyTorch's documented autocast lists (`docs`), every op on them measured
  (`ops`, `atlas`), and torch.compile's helpers for the compiled claims (`torch_compile`: a fresh
  compile, its count, the upstream settings that restore eager's behaviour).
"""
