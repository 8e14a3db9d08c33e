#!/usr/bin/python3
"""PyTorch reference losses for regc's end-to-end T5 training test.

For a few small T5 shapes with deliberately odd sizes, this script builds the
weights and the token stream with the SAME counter-based RNG as common/rng.c,
trains 5 steps of AdamW in plain PyTorch with Hugging Face
T5ForConditionalGeneration semantics (dropout 0) and writes the per-step
losses to tests/data/t5_reference.json, which tests/test_train_reference.c
replays through `regc train`. The file also records relative-position bucket
tables, which tests/test_t5_frontend.c compares with regc's.

Data mapping (as regc's t5 fill_inputs): batch k reads rows of 2T tokens with
llm.c's batch order (regc_tokens_batch with sequence 2T); the encoder reads
the first T tokens of a row, the decoder predicts the last T, and is fed them
shifted right behind decoder_start_token_id (HF's _shift_right).

Run with Debian's python3 (torch + numpy):  /usr/bin/python3 tools/reference/t5_reference.py

Nothing here imports transformers: every choice (no score scaling, RMS layer
norm without mean or bias, the position bias from block 0 shared by every
layer of a stack, bidirectional vs causal buckets, gelu_new in gated-gelu,
the d_model^-1/2 rescale before a tied head) is written out.
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F

from reference_common import batch_start, default_out, run_case

# ---------------------------------------------------------------------------
# The cases: small, odd shapes.
# ---------------------------------------------------------------------------
CASES = [
    # Tied relu T5; 70 tokens with B*2T = 24 give batches at 0, 24, 0, 24, 0: wraps.
    dict(name="relu_tied_wrap", seed=5001, vocab_size=211, d_model=40, d_kv=12, d_ff=72,
         num_layers=2, num_decoder_layers=None, num_heads=3,
         relative_attention_num_buckets=32, relative_attention_max_distance=128,
         layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True,
         decoder_start_token_id=None, batch=2, seq=6, lr=3e-3, weight_decay=0.0, n_tokens=70),
    # T5 v1.1 style: gated-gelu, untied head, decoder start 7, weight decay,
    # T = 17 past the 8 exact bidirectional positions into the log buckets.
    dict(name="gated_gelu_untied", seed=20240521, vocab_size=263, d_model=48, d_kv=10, d_ff=56,
         num_layers=2, num_decoder_layers=2, num_heads=4,
         relative_attention_num_buckets=32, relative_attention_max_distance=128,
         layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
         decoder_start_token_id=7, batch=3, seq=17, lr=2e-3, weight_decay=0.1, n_tokens=400),
    # 3 encoder and 1 decoder layers, few buckets with a short max distance
    # (the log range and its clamp at num_buckets - 1 both in play), eps 1e-5.
    dict(name="enc3_dec1_few_buckets", seed=77, vocab_size=300, d_model=36, d_kv=9, d_ff=50,
         num_layers=3, num_decoder_layers=1, num_heads=2,
         relative_attention_num_buckets=10, relative_attention_max_distance=9,
         layer_norm_epsilon=1e-5, feed_forward_proj="relu", tie_word_embeddings=True,
         decoder_start_token_id=None, batch=2, seq=13, lr=1.5e-3, weight_decay=0.05,
         n_tokens=300),
    # 1 encoder and 3 decoder layers, gated, tied; 110 tokens with B*2T = 44
    # give 0, 44, 0, 44, 0: wraps.
    dict(name="enc1_dec3_gated_tied_wrap", seed=31337, vocab_size=199, d_model=32, d_kv=8,
         d_ff=40, num_layers=1, num_decoder_layers=3, num_heads=5,
         relative_attention_num_buckets=16, relative_attention_max_distance=20,
         layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=True,
         decoder_start_token_id=3, batch=2, seq=11, lr=2e-3, weight_decay=0.01, n_tokens=110,
         bf16=True),  # and the bf16 block (reference_common.bf16_record)
]


def n_dec(case):
    return case["num_decoder_layers"] if case["num_decoder_layers"] is not None else case["num_layers"]


def start_id(case):
    return case["decoder_start_token_id"] if case["decoder_start_token_id"] is not None else 0


def param_specs(case):
    """(name, shape, center, halfwidth) in T5ForConditionalGeneration's
    state-dict order without the embed_tokens copies of shared.weight; the
    position in this list is the parameter's substream index t."""
    V, C, F_, HD = case["vocab_size"], case["d_model"], case["d_ff"], case["num_heads"] * case["d_kv"]
    NB, H = case["relative_attention_num_buckets"], case["num_heads"]
    norm, weight = (1.0, 0.2), (0.0, 0.3)
    gated = case["feed_forward_proj"] == "gated-gelu"

    def attn(prefix, bias):
        s = [(prefix + ".q.weight", (HD, C), *weight),  # nn.Linear: [out, in]
             (prefix + ".k.weight", (HD, C), *weight),
             (prefix + ".v.weight", (HD, C), *weight),
             (prefix + ".o.weight", (C, HD), *weight)]
        if bias:
            s.append((prefix + ".relative_attention_bias.weight", (NB, H), 0.0, 0.5))
        return s

    def ff(block, i):
        wi = ([(block + ".layer.%d.DenseReluDense.wi_0.weight" % i, (F_, C), *weight),
               (block + ".layer.%d.DenseReluDense.wi_1.weight" % i, (F_, C), *weight)] if gated
              else [(block + ".layer.%d.DenseReluDense.wi.weight" % i, (F_, C), *weight)])
        return wi + [(block + ".layer.%d.DenseReluDense.wo.weight" % i, (C, F_), *weight),
                     (block + ".layer.%d.layer_norm.weight" % i, (C,), *norm)]

    specs = [("shared.weight", (V, C), 0.0, 1.0)]
    for l in range(case["num_layers"]):
        b = "encoder.block.%d" % l
        specs += attn(b + ".layer.0.SelfAttention", l == 0)
        specs += [(b + ".layer.0.layer_norm.weight", (C,), *norm)]
        specs += ff(b, 1)
    specs += [("encoder.final_layer_norm.weight", (C,), *norm)]
    for l in range(n_dec(case)):
        b = "decoder.block.%d" % l
        specs += attn(b + ".layer.0.SelfAttention", l == 0)
        specs += [(b + ".layer.0.layer_norm.weight", (C,), *norm)]
        specs += attn(b + ".layer.1.EncDecAttention", False)
        specs += [(b + ".layer.1.layer_norm.weight", (C,), *norm)]
        specs += ff(b, 2)
    specs += [("decoder.final_layer_norm.weight", (C,), *norm)]
    if not case["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (V, C), *weight))
    return specs


# ---------------------------------------------------------------------------
# T5 forward, Hugging Face semantics (T5ForConditionalGeneration, dropout 0)
# ---------------------------------------------------------------------------
def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5Attention._relative_position_bucket, verbatim."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def bucket_table(q_len, k_len, bidirectional, case):
    context = torch.arange(q_len, dtype=torch.long)[:, None]
    memory = torch.arange(k_len, dtype=torch.long)[None, :]
    return relative_position_bucket(memory - context, bidirectional,
                                    case["relative_attention_num_buckets"],
                                    case["relative_attention_max_distance"])  # [Tq, Tk]


def compute_bias(table, T, bidirectional, case):
    """T5Attention.compute_bias: [1, H, T, T]."""
    values = F.embedding(bucket_table(T, T, bidirectional, case), table)  # [T, T, H]
    return values.permute([2, 0, 1]).unsqueeze(0)


def layer_norm(x, w, eps):
    """T5LayerNorm: RMS only, no mean, no bias."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def attention(x, kv, p, prefix, case, position_bias, causal):
    B, T, _ = x.shape
    Tk = kv.shape[1]
    H, D = case["num_heads"], case["d_kv"]
    q = F.linear(x, p[prefix + ".q.weight"]).view(B, T, H, D).transpose(1, 2)   # [B, H, T, D]
    k = F.linear(kv, p[prefix + ".k.weight"]).view(B, Tk, H, D).transpose(1, 2)  # [B, H, Tk, D]
    v = F.linear(kv, p[prefix + ".v.weight"]).view(B, Tk, H, D).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(3, 2))  # no 1/sqrt(d): T5 folds it into q's init
    bias = position_bias if position_bias is not None else torch.zeros_like(scores[:1])
    if causal:
        # HF's extended attention mask: finfo.min added where a key is in the future
        mask = torch.tril(torch.ones(T, Tk, dtype=torch.bool))
        bias = bias + torch.where(mask, torch.tensor(0.0, dtype=scores.dtype),
                                  torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    scores = scores + bias
    w = F.softmax(scores.float(), dim=-1).type_as(scores)
    y = torch.matmul(w, v).transpose(1, 2).contiguous().view(B, T, H * D)
    return F.linear(y, p[prefix + ".o.weight"])  # [B, T, C]


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def feed_forward(x, p, block, i, case):
    h = layer_norm(x, p[block + ".layer.%d.layer_norm.weight" % i], case["layer_norm_epsilon"])
    d = block + ".layer.%d.DenseReluDense." % i
    if case["feed_forward_proj"] == "gated-gelu":
        h = gelu_new(F.linear(h, p[d + "wi_0.weight"])) * F.linear(h, p[d + "wi_1.weight"])
    else:
        h = F.relu(F.linear(h, p[d + "wi.weight"]))
    return x + F.linear(h, p[d + "wo.weight"])


def get_pairs(case, k):
    """Rows of 2T tokens (regc_tokens_batch with sequence 2T) split in two."""
    B, T = case["batch"], case["seq"]
    p = batch_start(k, len(case["tokens"]), B * 2 * T)
    rows = torch.from_numpy(case["tokens"][p:p + B * 2 * T]).view(B, 2 * T)
    inputs, labels = rows[:, :T], rows[:, T:]
    # HF's _shift_right
    dec = labels.new_zeros(labels.shape)
    dec[:, 1:] = labels[:, :-1].clone()
    dec[:, 0] = start_id(case)
    return inputs, dec, labels


def forward_loss(p, k, case):
    inputs, dec_inputs, labels = get_pairs(case, k)
    T = inputs.shape[1]
    eps = case["layer_norm_epsilon"]
    # encoder
    x = F.embedding(inputs, p["shared.weight"])  # [B, T, C]
    bias = compute_bias(p["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                        T, True, case)
    for l in range(case["num_layers"]):
        b = "encoder.block.%d" % l
        h = layer_norm(x, p[b + ".layer.0.layer_norm.weight"], eps)
        x = x + attention(h, h, p, b + ".layer.0.SelfAttention", case, bias, False)
        x = feed_forward(x, p, b, 1, case)
    enc = layer_norm(x, p["encoder.final_layer_norm.weight"], eps)
    # decoder
    y = F.embedding(dec_inputs, p["shared.weight"])
    bias = compute_bias(p["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
                        T, False, case)
    for l in range(n_dec(case)):
        b = "decoder.block.%d" % l
        h = layer_norm(y, p[b + ".layer.0.layer_norm.weight"], eps)
        y = y + attention(h, h, p, b + ".layer.0.SelfAttention", case, bias, True)
        h = layer_norm(y, p[b + ".layer.1.layer_norm.weight"], eps)
        y = y + attention(h, enc, p, b + ".layer.1.EncDecAttention", case, None, False)
        y = feed_forward(y, p, b, 2, case)
    y = layer_norm(y, p["decoder.final_layer_norm.weight"], eps)
    if case["tie_word_embeddings"]:
        y = y * (case["d_model"] ** -0.5)
        head = p["shared.weight"]
    else:
        head = p["lm_head.weight"]
    logits = F.linear(y, head)  # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def hf_config(case):
    """The config.json the C test writes (the fields HF's T5Config reads).
    dropout_rate is 0 because regc does not apply dropout in training."""
    cfg = {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": case["vocab_size"],
        "d_model": case["d_model"],
        "d_kv": case["d_kv"],
        "d_ff": case["d_ff"],
        "num_layers": case["num_layers"],
        "num_decoder_layers": case["num_decoder_layers"],
        "num_heads": case["num_heads"],
        "relative_attention_num_buckets": case["relative_attention_num_buckets"],
        "relative_attention_max_distance": case["relative_attention_max_distance"],
        "layer_norm_epsilon": case["layer_norm_epsilon"],
        "feed_forward_proj": case["feed_forward_proj"],
        "tie_word_embeddings": case["tie_word_embeddings"],
        "is_encoder_decoder": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "dropout_rate": 0.0,
    }
    if case["decoder_start_token_id"] is not None:
        cfg["decoder_start_token_id"] = case["decoder_start_token_id"]
    return cfg


# Bucket tables for the frontend test, (num_buckets, max_distance, n): the
# bucket of every relative position -(n-1) .. n-1 (key minus query), both
# directions; a [T, T] table holds bucket[j - i] at [i, j].
BUCKET_TABLES = [(32, 128, 300), (10, 9, 20), (16, 20, 40), (4, 3, 12), (64, 1000, 1100)]


def bucket_records():
    out = []
    for nb, md, n in BUCKET_TABLES:
        rel = torch.arange(-(n - 1), n, dtype=torch.long)
        for bidirectional in (True, False):
            out.append({"num_buckets": nb, "max_distance": md, "n": n,
                        "bidirectional": bidirectional,
                        "buckets": relative_position_bucket(rel, bidirectional, nb, md).tolist()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "t5_reference.json"))
    args = ap.parse_args()
    out_cases = []
    for case in CASES:
        assert case["n_tokens"] >= case["batch"] * 2 * case["seq"] + 1
        out_cases.append(run_case(case, param_specs(case), hf_config(case), forward_loss))
    doc = {"generator": "tools/reference/t5_reference.py", "torch": torch.__version__,
           "cases": out_cases, "buckets": bucket_records()}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote %s (%d cases, %d bucket tables)" % (args.out, len(out_cases), len(doc["buckets"])))


if __name__ == "__main__":
    main()
