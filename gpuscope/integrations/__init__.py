"""One line in a Trainer: callbacks that record what `gpuscope.record` records.

- `gpuscope.integrations.hf.GpuscopeCallback` for transformers' Trainer (extra `gpuscope[hf]`);
- `gpuscope.integrations.lightning.GpuscopeCallback` for Lightning's Trainer (extra
  `gpuscope[lightning]`).

Each takes `GpuscopeCallback(run_dir, **record_options)` and writes the same run dir.
"""
