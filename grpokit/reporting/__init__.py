"""What a run computes and what it did: the explain table, training curves, and report.md."""
