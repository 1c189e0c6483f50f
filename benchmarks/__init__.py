"""The project's benchmarks, one folder per purpose; each script runs as a module from the repository root
(`uv run python -m benchmarks.suite.run ...`), except `gpu_check.py`, which operators run by its path.

- `common.py`: what the scripts share (machine description, flag files, TensorBoard scalars, markdown, reports);
- `suite/`: the reproducibility suite (run.py, its configs/ and starts/), the statistics (rlstats.py), where every
  published figure comes from (provenance.py, quotes.py) and re-running published runs (recheck.py);
- `speed/`: speed probes (speed.py, update_speed.py, update_vs.py, async_speed.py with slow_policy.py, the
  PushCubeRL env's throughput, compile_cost.py);
- `peers/`: side by side with other projects (CleanRL, rsl_rl, mjlab, sb3-contrib) and their runners;
- `experiments/`: finished experiments (memory on partially observed tasks, the VLA experiments, PushCubeRL's variants);
- `archaeology/`: what the code of other commits computed (bisect_numbers.py, curves_at.py, fingerprints_at.py);
- `gpu_check.py`: one prepared check of the project on a lent GPU.

docs/benchmarks.md says what each measures and where its reports are.
"""
