"""pile-gpt's library: what the scripts at the repository root (prepare_data.py, to_mds.py, upload_s3.py,
train.py, sample.py, export_hf.py) share. Each module owns one thing; docs/layout.md lists them.
Importing the package imports nothing else."""
