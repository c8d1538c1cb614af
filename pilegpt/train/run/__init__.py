"""A run's life around the training loop: its folder and lock, the resume repairs, the data record, the uploads,
preemption, the job's processes and nodes, and the end of the run (config.json, report.md, the summary line)."""
