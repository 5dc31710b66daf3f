"""The studies built on runs: a study as a multirun, its report, the reproductions of the source claims."""
