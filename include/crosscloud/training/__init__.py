"""The training algorithm: model, corpus, compression, screening, outer step, checkpoints, worker, the clouds' round exchange and the watcher."""
