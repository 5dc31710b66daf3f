"""The tools around runs and studies: benchmarks, the GPU check, the offline wheelhouse, the W&B dashboard."""
