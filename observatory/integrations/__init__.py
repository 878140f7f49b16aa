"""Other tools' training runs onto our event log.

- `wandb_api` (+ `wandb_objects`): `import observatory as wandb`, trackio's calls too.
- `levanter`: a Levanter tracker (`type: observatory`) and its `train_lm` launcher; needs the
  `observatory[levanter]` extra, so nothing else imports it.
"""
