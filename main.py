"""Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding.

    python main.py                                   # offline: the bundled Shakespeare pair
    python main.py --draft_model_size 124M --target_model_size 355M --prompt "Alan Turing" -v
    python main.py --help                            # every flag

The command lives in gpt2np/cli.py (installed as `gpt2np` by `pip install -e .`); it only calls
the package's public API. To read how it works, start at README's reading order.
"""
import gpt2np.cli  # before NumPy: gpt2np sets OpenBLAS's thread timeout (gpt2np/model/fast)

if __name__ == "__main__":
    gpt2np.cli.run()
