"""Medusa: tree rules and presets (`choices`, torch-free), the token tree the runtime verifies (`tree`), and
heads trained on a frozen base (`train`, which pulls in transformers). Import the module you need.
"""
