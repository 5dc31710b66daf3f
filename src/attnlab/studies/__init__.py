"""The studies read from their runs: each study's report, the README's findings, the streaming study."""
