"""Other tools' APIs onto our event log: `wandb_api` (`import observatory as wandb`, trackio's calls too)."""
