"""Training: configs, data sets, models, the parallel modes, the step builder, the trainer and its runs."""
