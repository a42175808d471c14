"""Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding.

    python main.py                                   # offline: the bundled Shakespeare pair
    python main.py --draft_model_size gpt2 --target_model_size gpt2-medium --prompt "Alan Turing" -v
    python main.py --target_model_size random:1558M --draft_model_size random:124M   # random weights, no weights
                                                     # download (the tokenizer's files in a folder of --models_dir)
    python main.py --help                            # every flag, and the other repositories' spellings

The command lives in gpt2np/cli/ (installed as `gpt2np` by `pip install -e .`); it only calls
the package's public API. To read how it works, start at README's reading order.
"""
import sys

try:  # Ctrl-C while NumPy and the package load: exit 130 (as during a run), no traceback
    import gpt2np.cli  # before NumPy: gpt2np sets OpenBLAS's thread timeout (gpt2np/model/fast)
except KeyboardInterrupt:
    sys.exit(130)

if __name__ == "__main__":
    gpt2np.cli.run()
