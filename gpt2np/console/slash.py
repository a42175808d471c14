"""The console's '/' commands: the ':' commands, under the names romsto/Speculative-Decoding's
console (infer.py) taught its users. Pure: a typed '/' line in, the ':' line it means out (colon_line);
parse_typed parses either kind.

    /quit /clear /speculative /target /cache     the ':' command of the same name
    /debug                                       :trace (every round's drafts, p, q, decisions)
    /length N                                    :tokens N
    /gamma N                                     :K N (Leviathan et al.'s gamma is our K)
    /processor MODE [...]                        :sampling MODE [...] (greedy | plain | top_k N | nucleus P, then T)
    /drafter [on|off]                            :draft: there, /drafter toggles the draft model writing alone
    /drafter NAME                                :drafter NAME (switch the drafter: ngram, a model or folder)

Every other ':' command works with '/' too (/help, /K, /temperature ...); a '/' line that names
no command is a one-line error, never a prompt ('//' starts a prompt with '/'). An error names the
command as it was typed ('/gamma', ':k'), not as the ':' command it means (':K').

>>> colon_line("/gamma 3"), colon_line("/drafter"), colon_line("/drafter ngram")
(':K 3', ':draft', ':drafter ngram')
>>> colon_line("/chat")
Traceback (most recent call last):
gpt2np.console.commands.CommandError: unknown command /chat: type /help for the list
>>> from gpt2np.console.commands import Settings
>>> parse_typed("/gamma 0", Settings())
Traceback (most recent call last):
gpt2np.console.commands.CommandError: /gamma must be an integer >= 1, 'heuristic' or 'auto', got 0
"""
import re

from .commands import ACTIONS, ALIASES, COMMANDS, SWITCH_WORDS, CommandError, parse_command

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


def command_word(line):
    """The command as typed, its ':' or '/' with its name: '/gamma 2' -> '/gamma', ': k 3' -> ':k'."""
    words = line[1:].split()
    return line[0] + words[0] if words else line[:1]


def parse_typed(line, settings):
    """A typed ':' or '/' line -> parse_command's Outcome; its CommandError names the command as typed."""
    colon = colon_line(line) if line.startswith("/") else line
    try:
        return parse_command(colon, settings)
    except CommandError as e:
        raise CommandError(as_typed(str(e), colon, line)) from None


def as_typed(message, colon, line):
    """message with the ':' command that colon means named as line typed it: (':K must be ...', ':K 0',
    '/gamma 0') -> '/gamma must be ...'. Other commands it names (hints: ':cache on first') stay as they are."""
    name = command_word(colon)[1:]
    meant, typed = ":" + ALIASES.get(name, name), command_word(line)
    return re.sub(rf"(?<![\w:/]){re.escape(meant)}\b", lambda _: typed, message)
