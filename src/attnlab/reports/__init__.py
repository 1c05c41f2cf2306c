"""What the task families report, put together: RESULTS.md's blocks (`results`), the figures
of `attnlab compare` and the comparison at a sweep's end (`sweep`). The statistics they share
are `attnlab.compare`, which imports no task."""
