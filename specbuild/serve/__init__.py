"""serve: a real tritonserver on a deployed repository (`server.TritonServer`), its command line (`launch`), the
watch over its python stubs and leftovers (`watch`), where the binary comes from (`triton_env`) and what
`specbuild serve` does (`run`)."""
