"""Scripts the whole-process tests run as child processes, and the workload they share."""
