"""Hugging Face tokenizer fixtures: small byte-level BPE tokenizers trained with the `tokenizers`
package on the pipelines of Qwen2/Qwen3 (transformers' Qwen2Converter: NFC, one Split with the
Qwen2 regex, ByteLevel without its own regex) and of DeepSeek-V3 (its tokenizer.json: no
normalizer, Splits for digit runs of up to three, for CJK runs, and its main regex, then
ByteLevel), each with special tokens added the way those models add theirs; a multilingual test
text (digits, whitespace runs, emoji, CJK, accents, special tokens, a few thousand lines); and the
ids the library encodes it to, line by line.

Written for (tools/ref/requirements.txt): tokenizers 0.23.3 (what transformers 5.24.0 installs),
Python 3.11. Deterministic (fixed seeds, one thread).

  /work/venv-ref/bin/python tools/ref/write_tokenizer_fixtures.py --out tests/fixtures/tokenizers
writes OUT/test_text.txt and, per pipeline NAME (qwen2, deepseek_v3), OUT/NAME/tokenizer.json and
OUT/NAME/expected.jsonl (one {"ids": […]} per line of the test text, special tokens on); and
OUT/qwen2_flags/: the Qwen2 tokenizer with added tokens of every flag (lstrip, rstrip, single_word,
normalized, not special), its own test_text.txt of 300 lines around them, and expected.jsonl.
"""
import argparse
import json
import os
import random

os.environ["RAYON_NUM_THREADS"] = "1"  # the trainer's merges do not depend on it, but be plain

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
DEEPSEEK_V3_REGEXES = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"""
     r""" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
]

WORDS = ["the", "tokenizer", "splits", "text", "into", "pieces", "naïve", "café", "Straße", "déjà", "vu",
         "über", "façade", "don't", "we'll", "I'm", "they're", "it's", "HTTP", "JSON", "x86-64", "C++",
         "日本語", "中文字符", "東京", "ひらがな", "カタカナ", "한국어", "Ελληνικά", "русский", "עברית",
         "العربية", "हिन्दी", "😀", "🚀🚀", "👍🏽", "∑", "≤", "→", "½", "2026", "3.14159", "1,000,000",
         "0x1F", "v1.2.3", "e-mail", "foo_bar", "$100", "#tag", "@user", "(parens)", "[brackets]", "{braces}"]
SPACES = [" ", " ", " ", "  ", "   ", "\t", " \t ", "\u00a0", "\u3000"]
SPECIAL = {"qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
           "deepseek_v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]}


def sentence(rng):
    parts = []
    for _ in range(rng.randint(1, 14)):
        word = rng.choice(WORDS)
        if rng.random() < 0.1:
            word = word.upper() if rng.random() < 0.5 else word.capitalize()
        if rng.random() < 0.15:
            word += rng.choice([",", ".", "!", "?", ":", ";", "...", "'s"])
        parts.append(word)
        parts.append(rng.choice(SPACES))
    text = "".join(parts).rstrip(" ")
    if rng.random() < 0.1:
        text += rng.choice(["\n", "\n\n", " \n", "\r\n"])
    if rng.random() < 0.08:
        text = rng.choice(["  ", "\t", " "]) + text
    return text


def corpus(rng, lines):
    return [sentence(rng) for _ in range(lines)]


def test_lines(rng, lines, special):
    out = []
    for i in range(lines):
        text = sentence(rng)
        if rng.random() < 0.1:  # a special token inside, with or without spaces around it
            token = rng.choice(special)
            cut = rng.randint(0, len(text))
            pad = rng.choice(["", " ", "  "])
            text = text[:cut] + pad + token + pad + text[cut:]
        if i % 97 == 0:
            text = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))  # digit runs
        out.append(text)
    return out


def build(name):
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if name == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
        splits = [pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False)]
    else:
        tokenizer.normalizer = normalizers.Sequence([])
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DEEPSEEK_V3_REGEXES]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab", type=int, default=1200)
    parser.add_argument("--lines", type=int, default=3000)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train_text = corpus(random.Random(1), 20000)
    for name in ["qwen2", "deepseek_v3"]:
        tokenizer = build(name)
        trainer = trainers.BpeTrainer(vocab_size=args.vocab, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tokenizer.train_from_iterator(train_text, trainer=trainer)
        tokenizer.add_special_tokens(SPECIAL[name])
        directory = os.path.join(args.out, name)
        os.makedirs(directory, exist_ok=True)
        tokenizer.save(os.path.join(directory, "tokenizer.json"))
        lines = test_lines(random.Random(2), args.lines, SPECIAL["qwen2"] + SPECIAL["deepseek_v3"])
        if name == "qwen2":
            with open(os.path.join(args.out, "test_text.txt"), "w", encoding="utf-8", newline="") as f:
                f.write("".join(line + "\x00" for line in lines))  # NUL-separated: lines hold newlines
        with open(os.path.join(directory, "expected.jsonl"), "w", encoding="utf-8") as f:
            for line in lines:
                ids = tokenizer.encode(line, add_special_tokens=False).ids
                assert tokenizer.decode(ids, skip_special_tokens=False) == (
                    line if name != "qwen2" else __import__("unicodedata").normalize("NFC", line))
                f.write(json.dumps({"ids": ids}) + "\n")
    write_flags(args.out, train_text, args.vocab)


FLAG_TOKENS = [AddedToken("<left>", lstrip=True, special=True), AddedToken("<right>", rstrip=True, special=True),
               AddedToken("cafe", single_word=True, special=False), AddedToken("ﬁx", normalized=True, special=False),
               AddedToken("<both>", lstrip=True, rstrip=True, special=True)]


def flag_lines(rng, lines):
    pieces = ["<left>", "<right>", "<both>", "cafe", "ﬁx", "fix", "café", "cafes", "décafe", "_cafe", "ﬁxed"]
    out = []
    for _ in range(lines):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(pieces + WORDS[:20]))
            parts.append(rng.choice(["", " ", "  ", "\t", "\n", " \n "]))
        out.append("".join(parts))
    return out


def write_flags(out, train_text, vocab):
    tokenizer = build("qwen2")
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(train_text, trainer=trainer)
    tokenizer.add_tokens(FLAG_TOKENS)
    directory = os.path.join(out, "qwen2_flags")
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    lines = flag_lines(random.Random(3), 300)
    with open(os.path.join(directory, "test_text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\x00" for line in lines))
    with open(os.path.join(directory, "expected.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps({"ids": tokenizer.encode(line, add_special_tokens=False).ids}) + "\n")


if __name__ == "__main__":
    main()
