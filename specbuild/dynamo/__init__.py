"""NVIDIA Dynamo in front of the engines specbuild configures.

`spec` holds the spec's `deploy.dynamo` section and its fit checks; `write` is what `specbuild deploy` writes for
`deploy.target: dynamo` (the local launch and Kubernetes DynamoGraphDeployment manifests); `launch` starts the real
Dynamo frontend and N `worker`s (specbuild's reference serving engine as Dynamo workers) for `specbuild serve`.
"""
