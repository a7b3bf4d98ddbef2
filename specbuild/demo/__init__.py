"""The built-in demo models: a small target, draft and Medusa heads trained on the built-in corpus, cached."""
