"""The `tokenizers` library's batch encoding on a corpus, for docs/benchmarks.md's comparison with
`trillion tokenize --tokenizer tokenizer.json`: the corpus split into documents by the engine's
fortune rule (documents between lines of "%", each line ending in "\\n"), encoded with
encode_batch in batches of 4096 documents, timed around the encoding alone. Prints MB/s and the
token count (plus one end-of-text per document: the engine's total).

Written for (tools/ref/requirements.txt): tokenizers 0.23.3, Python 3.11.

  RAYON_NUM_THREADS=N /work/venv-ref/bin/python tools/ref/bench_tokenize_hf.py TOKENIZER.json CORPUS N
"""
import os
import re
import sys
import time


def main():
    path, corpus, threads = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["RAYON_NUM_THREADS"] = threads  # read when the library starts its pool
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(path)
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    documents = [d for d in re.split(r"^%\n", text, flags=re.M) if d.strip()]
    start = time.time()
    tokens = 0
    for i in range(0, len(documents), 4096):
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(documents[i:i + 4096], add_special_tokens=False))
    seconds = time.time() - start
    print(f"tokenizers threads={threads}: {len(text.encode()) / 1e6 / seconds:.2f} MB/s, "
          f"{tokens} tokens + {len(documents)} documents, {seconds:.2f} s")


if __name__ == "__main__":
    main()
