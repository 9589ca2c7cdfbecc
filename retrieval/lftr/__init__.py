"""LFTR: the latent-rollout retriever head (config, model, data, training, prediction, jobs)."""
