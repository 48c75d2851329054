"""Train the tiny checkpoints' byte-level BPE tokenizer offline on the built-in corpus (deterministic).

ChatML special tokens come first, so their ids are fixed: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
A checkpoint whose vocabulary is larger (a real model's shape) gets the rest as filler words, so every
id a random model samples decodes to visible text.
"""

import json
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from tandem.models import hf_files
from tandem.models.corpus import CORPUS

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TINY_VOCAB_SIZE = 512


def train_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> Tokenizer:
    """GPT-2 style byte-level BPE: every byte is in the alphabet, so any text round-trips."""
    tok = Tokenizer(BPE(fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def pad_vocab(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """The same tokenizer with ids up to vocab_size - 1 filled by words (" ab", " ac", ...): never
    produced by encoding (no merge makes them), each decoding to a space and lowercase letters."""
    have = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size <= have:
        return tok
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    words = _filler_words(set(vocab))
    for token_id in range(have, vocab_size):
        vocab[next(words)] = token_id
    return Tokenizer.from_str(json.dumps(data))


def _filler_words(taken: set[str]):
    """Byte-level spellings ("Ġ" is the space) of lowercase words of 2, 3, ... letters, not in `taken`."""
    letters = string.ascii_lowercase
    length = 2
    while True:
        for n in range(len(letters) ** length):
            word = "".join(letters[(n // len(letters) ** i) % len(letters)] for i in reversed(range(length)))
            if "\u0120" + word not in taken:
                yield "\u0120" + word
        length += 1


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def write_tokenizer(out_dir: Path, tok: Tokenizer, model_max_length: int) -> None:
    hf_files.write_tokenizer_files(
        out_dir,
        tok,
        chat_template=hf_files.CHATML_TEMPLATE,
        # NOTE: ChatML models (Qwen) prepend no BOS; the chat template carries the structure
        special={"bos_token": None, "eos_token": IM_END, "pad_token": ENDOFTEXT, "unk_token": None},
        model_max_length=model_max_length,
    )
