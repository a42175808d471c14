"""The console's '/' commands: the ':' commands, under the names romsto/Speculative-Decoding's
console (infer.py) taught its users. Pure: one typed '/' line in, the ':' line it means out.

    /quit /clear /speculative /target /cache     the ':' command of the same name
    /debug                                       :trace (every round's drafts, p, q, decisions)
    /length N                                    :tokens N
    /gamma N                                     :K N (Leviathan et al.'s gamma is our K)
    /processor MODE [...]                        :sampling MODE [...] (greedy | plain | top_k N | nucleus P, then T)
    /drafter [on|off]                            :draft: there, /drafter toggles the draft model writing alone
    /drafter NAME                                :drafter NAME (switch the drafter: ngram, a model or folder)

Every other ':' command works with '/' too (/help, /K, /temperature ...); a '/' line that names
no command is a one-line error, never a prompt ('//' starts a prompt with '/').

>>> colon_line("/gamma 3"), colon_line("/drafter"), colon_line("/drafter ngram")
(':K 3', ':draft', ':drafter ngram')
>>> colon_line("/chat")
Traceback (most recent call last):
gpt2np.console.commands.CommandError: unknown command /chat: type /help for the list
"""
from .commands import ACTIONS, ALIASES, COMMANDS, SWITCH_WORDS, CommandError

SLASH_NAMES = {"gamma": "K", "length": "tokens", "processor": "sampling", "debug": "trace"}


def colon_line(line):
    """'/name args' -> ':command args', the ':' command with that meaning; CommandError if none."""
    words = line[1:].split()
    if not words:
        raise CommandError("empty command: type /help for the list")
    name, rest = words[0], line[1:].split(None, 1)[1:]
    if name == "drafter":  # romsto's /drafter is our :draft; a name after it is our :drafter
        toggles = len(words) == 1 or (len(words) == 2 and words[1].lower() in SWITCH_WORDS)
        name = "draft" if toggles else "drafter"
    name = SLASH_NAMES.get(name, name)
    if ALIASES.get(name, name) not in COMMANDS and ALIASES.get(name, name) not in ACTIONS:
        raise CommandError(f"unknown command /{words[0]}: type /help for the list")
    return ":" + " ".join([name, *rest])
