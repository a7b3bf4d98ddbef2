"""tune stage: measures acceptance on calibration text and writes K, the Medusa tree and the draft-length
schedule back into the spec (`stage.run_tune`); `measure`, `tree` and `schedule` hold the pure choices,
`spec_edit` the comment-preserving YAML edit."""
