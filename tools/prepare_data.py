#!/usr/bin/env python3
"""Turn text into regc's training data: an llm.c token file and a loss mask.

    tools/prepare_data.py --jsonl sft.jsonl --tokenizer tokenizer.json --out data/sft
    tools/prepare_data.py --text corpus.txt --tokenizer tokenizer.json --out data/corpus

writes OUT.bin (llm.c's format: a 256-int32 header with magic 20240520, version
1 and the token count, then uint16 tokens; for a vocabulary past 65,536 tokens,
as Llama 3's, its other format: magic 20240801, version 7, uint32 tokens) and,
for JSONL, OUT.mask.bin (the same header with magic 20240601, then one byte per
token: 1 when predicting that token counts toward the loss). Train with

    regc train --model ... --data OUT.bin --loss-mask OUT.mask.bin

With --shard-tokens N it writes shards of N tokens as llm.c's datasets come
instead, OUT_000000.bin, OUT_000001.bin, ... (and OUT_000000.mask.bin, ...),
each written as it fills, so that JSONL of any size passes through a bounded
memory (a --text file is read whole); regc reads them as one file through a
quoted pattern:

    regc train --model ... --data 'OUT_??????.bin' --loss-mask 'OUT_??????.mask.bin'

The shards take their names when the run ends well, and an earlier run's
shards of OUT past this run's last (and its masks, where this run writes none)
are removed then, so that the pattern names this run's data alone; a run that
fails leaves OUT's shards as they were.

JSONL: one object per line with "prompt" and "response" strings. Each example
becomes prompt tokens, response tokens and the end-of-text token, packed one
after another into one stream that regc cuts into rows of --seq tokens; the
mask is 0 on the prompt and 1 on the response and the end-of-text token, so
the loss is on the responses only. Text: the whole file, every token counted
(no mask is written; regc counts every target without one). With
--eod-token-id set to the end-of-text id this prints, regc trains each packed
example as if alone: attention never looks back past an end of text.

The tokenizer is a Hugging Face tokenizer.json read with the `tokenizers`
package (pip install tokenizers), the end of text its --eos token. Without
--tokenizer the text is byte-level (every byte one token, ids < 256) and the
end of text is --eos-id (default 0), as regc's built-in corpus is.
Every error is one line naming the file (and the line of a JSONL file).
"""

import argparse
import array
import glob
import json
import os
import struct
import sys
import tempfile

TOKENS_MAGIC = 20240520
MASK_MAGIC = 20240601
VERSION = 1
# llm.c's token formats: (magic, version, array typecode of the tokens)
FORMATS = {"gpt-2": (TOKENS_MAGIC, 1, "H"), "llama-3": (20240801, 7, "I")}


class DataError(Exception):
    pass


def write_atomic(path, header_magic, count, body, version=VERSION):
    """The header and body to path through a temporary file and a rename,
    so a killed run leaves no half-written file under the real name."""
    header = struct.pack("<3i", header_magic, version, count) + bytes(256 * 4 - 12)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".tmp.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; data files are ordinary files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class ByteTokenizer:
    """Every UTF-8 byte one token: ids < 256."""

    def __init__(self, eos_id):
        self.eos = eos_id
        self.vocab = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


class HFTokenizer:
    def __init__(self, path, eos_token):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DataError("%s: reading a tokenizer.json needs the tokenizers package "
                            "(pip install tokenizers)" % path)
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the package's own exceptions vary
            raise DataError("%s: not a tokenizer.json: %s" % (path, str(e).splitlines()[0]))
        self.vocab = self.tok.get_vocab_size()
        self.eos = self.tok.token_to_id(eos_token)
        if self.eos is None:
            raise DataError("%s: no token %r for the end of text (--eos)" % (path, eos_token))

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def from_jsonl(path, tok):
    """Each example's tokens and mask, in order."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError("%s: cannot open: %s" % (path, e.strerror))
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError("%s:%d: malformed JSON: %s" % (path, n, e.msg))
            if not isinstance(ex, dict):
                raise DataError("%s:%d: expected an object with \"prompt\" and \"response\""
                                % (path, n))
            for key in ("prompt", "response"):
                if not isinstance(ex.get(key), str):
                    raise DataError("%s:%d: \"%s\" is missing or not a string" % (path, n, key))
            p, r = tok.encode(ex["prompt"]), tok.encode(ex["response"])
            yield p + r + [tok.eos], [0] * len(p) + [1] * (len(r) + 1)


def from_text(path, tok):
    """The whole file's tokens, every one counted (no mask)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise DataError("%s: cannot open: %s" % (path, e.strerror))
    except UnicodeDecodeError as e:
        raise DataError("%s: not UTF-8 at byte %d" % (path, e.start))
    yield tok.encode(text), None


STAGED = ".staged"  # a shard written but not yet one of OUT's: no pattern matches it
MAX_SHARDS = 1000000  # six digits: OUT_??????.bin names them all, in order


class Writer:
    """Tokens (and their mask) into OUT.bin, or into shards of shard_tokens
    written as each fills. Tokens are held as uint16 and mask bytes as
    bytes: two and one byte each, not a Python integer. Shards are written
    under a staged name and renamed into place only when the run ends well,
    the earlier run's extra shards removed then, so a failed run leaves OUT's
    shards as they were rather than a mix of two runs'."""

    def __init__(self, out, shard_tokens, has_mask, fmt):
        self.out, self.shard, self.has_mask = out, shard_tokens, has_mask
        self.magic, self.version, self.typecode = FORMATS[fmt]
        self.tokens, self.mask = self._new_tokens(), bytearray()
        self.total = self.counted = self.shards = 0
        self.abandon()  # a killed run's staged shards: never this run's to publish

    def _new_tokens(self):
        want = 2 if self.typecode == "H" else 4
        for code in (self.typecode, "I", "L"):  # the C type of that width on this host
            if array.array(code).itemsize == want:
                return array.array(code)
        raise DataError("this Python has no %d-byte unsigned array type" % want)

    def _path(self, index, mask):
        if not self.shard:
            return self.out + (".mask.bin" if mask else ".bin")
        return "%s_%06d%s" % (self.out, index, ".mask.bin" if mask else ".bin")

    def _flush(self):
        if self.shard and self.shards == MAX_SHARDS:
            raise DataError("--shard-tokens: %d tokens make more than %d shards"
                            % (self.shard, MAX_SHARDS - 1))
        n, staged = len(self.tokens), STAGED if self.shard else ""
        if sys.byteorder != "little":
            self.tokens.byteswap()
        write_atomic(self._path(self.shards, False) + staged, self.magic, n,
                     self.tokens.tobytes(), self.version)
        if self.has_mask:
            write_atomic(self._path(self.shards, True) + staged, MASK_MAGIC, n, bytes(self.mask))
        self.tokens, self.mask = self._new_tokens(), bytearray()
        self.shards += 1

    def add(self, tokens, mask):
        """An example's tokens and mask (None: every token counted), into
        shards as they fill."""
        self.total += len(tokens)
        self.counted += sum(mask) if mask is not None else len(tokens)
        i = 0
        while i < len(tokens):
            room = self.shard - len(self.tokens) if self.shard else len(tokens) - i
            self.tokens.extend(tokens[i:i + room])
            if mask is not None:
                self.mask.extend(mask[i:i + room])
            i += room
            if self.shard and len(self.tokens) == self.shard:
                self._flush()

    def _own_shards(self):
        """OUT's shards on disk (staged or not): (index, path, staged)."""
        prefix = os.path.basename(self.out) + "_"
        for path in glob.glob(glob.escape(self.out) + "_[0-9][0-9][0-9][0-9][0-9][0-9]*"):
            rest = os.path.basename(path)[len(prefix):]
            staged = rest.endswith(STAGED)
            kind = rest[6:len(rest) - len(STAGED)] if staged else rest[6:]
            if rest[:6].isdigit() and kind in (".bin", ".mask.bin"):
                yield int(rest[:6]), path, staged, kind == ".mask.bin"

    def abandon(self):
        """Staged shards removed (a failed run's, or a killed one's), OUT's
        own left alone."""
        for _, path, staged, _ in list(self._own_shards()) if self.shard else []:
            if staged:
                os.unlink(path)

    def finish(self, source):
        if not self.total:
            raise DataError("%s: %s" % (source, "no examples" if self.has_mask else "no text"))
        if not self.shard and self.total > 2**31 - 1:
            raise DataError("%s: %d tokens do not fit the header's int32 count "
                            "(--shard-tokens splits them)" % (source, self.total))
        if self.tokens or not self.shard:
            self._flush()
        if not self.shard:
            return
        # the earlier run's shards past this run's last, and its masks where
        # this run writes none; then this run's into place
        for index, path, staged, mask in list(self._own_shards()):
            if not staged and (index >= self.shards or (mask and not self.has_mask)):
                os.unlink(path)
        for index, path, staged, mask in list(self._own_shards()):
            if staged:
                os.replace(path, path[:-len(STAGED)])


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--jsonl", help='examples {"prompt": ..., "response": ...}, one per line')
    src.add_argument("--text", help="plain UTF-8 text, every token counted")
    ap.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (default: bytes)")
    ap.add_argument("--eos", default="<|endoftext|>",
                    help="the tokenizer's end-of-text token (Llama 3's: <|end_of_text|>)")
    ap.add_argument("--eos-id", type=int, default=0, help="byte-level end of text (0..255)")
    ap.add_argument("--out", required=True, help="writes OUT.bin and, for JSONL, OUT.mask.bin")
    ap.add_argument("--shard-tokens", type=int, default=0,
                    help="shards of N tokens, OUT_000000.bin, ..., as llm.c's datasets come")
    ap.add_argument("--format", choices=sorted(FORMATS),
                    help="llm.c's token format: gpt-2 (uint16) or llama-3 (uint32); default: "
                    "llama-3 where the vocabulary passes 65,536 tokens, else gpt-2")
    args = ap.parse_args(argv)
    source = args.jsonl or args.text
    try:
        if args.tokenizer:
            tok = HFTokenizer(args.tokenizer, args.eos)
        elif not 0 <= args.eos_id < 256:
            raise DataError("--eos-id: %d is not a byte (0..255)" % args.eos_id)
        else:
            tok = ByteTokenizer(args.eos_id)
        if not 0 <= args.shard_tokens <= 2**31 - 1:
            raise DataError("--shard-tokens: %d is not a token count (0: one file; "
                            "else 1 .. 2^31 - 1)" % args.shard_tokens)
        fmt = args.format or ("llama-3" if tok.vocab > 65536 else "gpt-2")
        if fmt == "gpt-2" and tok.vocab > 65536:
            raise DataError("--format gpt-2: a vocabulary of %d tokens does not fit its uint16 "
                            "ids (llama-3's uint32 do)" % tok.vocab)
        w = Writer(args.out, args.shard_tokens, bool(args.jsonl), fmt)
        try:
            for tokens, mask in (from_jsonl if args.jsonl else from_text)(source, tok):
                w.add(tokens, mask)
            w.finish(source)
        except BaseException:
            w.abandon()
            raise
    except DataError as e:
        print("prepare_data.py: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("prepare_data.py: %s: %s" % (e.filename or args.out, e.strerror), file=sys.stderr)
        return 1
    where = "%s.bin" % args.out if not args.shard_tokens else \
        "%s_??????.bin (%d shards)" % (args.out, w.shards)
    print("%s: %d tokens, %d counted toward the loss; end of text %d; llm.c's %s format"
          % (where, w.total, w.counted, tok.eos, fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
