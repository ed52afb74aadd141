"""The training algorithm: model, corpus, compression, screening, outer step, checkpoints, worker and coordinator."""
