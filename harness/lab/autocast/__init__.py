"""Autocast, measured op by op and compiled: what the docs list, what each op computes in.

- `docs`: PyTorch's documented autocast op lists, per device and release (`lists.toml`, cited);
- `ops`: how the atlas calls each listed op (inputs, an output to differentiate);
- `atlas`: every listed op measured under autocast on the session's device: the dtype it
  computed in, its gradients' dtypes, held against the lists;
- `torch_compile`: torch.compile's helpers for the compiled claims (a fresh compile, its count, the
  upstream settings that restore eager's behaviour, a fresh inductor cache per test and
  AOTAutograd's cache counters, the C++ compiler's -ffast-math probed);
- `scaled_loop`: the GradScaler loop that shows a compiled autocast(enabled=False) region's
  harm (shared with the known-bug reproduction);
- `compiled_atlas`: the atlas's ops under torch.compile, each held against eager.
"""
