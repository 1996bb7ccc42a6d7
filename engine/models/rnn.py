"""FlexFlow's three recurrent benchmarks, unrolled into operator graphs.

FlexFlow (Jia, Zaharia & Aiken, "Beyond Data and Model Parallelism for Deep Neural
Networks", SysML'19, Table 3) evaluates three RNNs, each unrolled over 40 steps with a
global batch of 64:

* **RNNTC**, text classification: embedding, stacked LSTMs, a classifier on the last step;
* **RNNLM**, language modelling on Penn Treebank: embedding, stacked LSTMs, a softmax over
  the vocabulary at every step;
* **NMT**, neural machine translation: LSTM encoder, LSTM decoder with attention, a softmax
  over the target vocabulary at every decoder step.

Each LSTM layer at each step is one ``lstm`` op (:mod:`engine.ops`); the steps of a layer
share one ``param_group`` and so one set of parameters, as an unrolled RNN does, and every
per-step op that has parameters (projections) shares a group across steps too. Ops of one
step carry the ``block`` label ``"<part>.t<step>"`` so that an app can collapse the repeated
steps.

Decisions the paper leaves open (this module's reading, not FlexFlow's text):

* NMT: hidden size 1024 and a 32k vocabulary (source and target each) come from the
  project's issue; 2 encoder and 2 decoder LSTM layers as the paper describes. Attention
  is Luong et al.'s global attention with the ``dot`` score and the attentional hidden
  state ``tanh(W_c [c_t; h_t])`` (Luong, Pham & Manning, EMNLP 2015, Eqs. 5 and 8), then a
  softmax over the vocabulary. No input feeding.
* NMT: decoder layer ``l`` starts from encoder layer ``l``'s final ``(h, c)``, as in
  sequence-to-sequence learning (Sutskever, Vinyals & Le, NIPS 2014, §2); so the first
  decoder step depends on the last encoder step.
* RNNTC: 4 LSTM layers of 1024 units, a 32k vocabulary and 2 classes; RNNLM: 2 LSTM layers
  of 1024 units and Penn Treebank's 10k vocabulary (Mikolov et al. 2010). These are this
  project's reading of the paper.
* LSTM parameters per layer: ``4*hidden*(in + hidden) + 4*hidden``, i.e. input and
  recurrent weights for the four gates and one bias, as Keras/TF's LSTM holds (cuDNN's
  two biases would add another ``4*hidden``). Every layer's input is ``hidden`` wide (the
  embedding width equals the hidden size).
* Embeddings are not tied to the output projections; no dropout.
* Token ids and labels are ``int64`` inputs ``[batch, steps]`` (axes ``sample, length``),
  split per step with ``squeeze``.

Preconditions not checked here beyond positivity of the sizes: the graph builder checks
shapes and dtypes as each op is added.
"""

from __future__ import annotations

from typing import Sequence

from ..graph import GraphBuilder, OpGraph, TensorRef

__all__ = ["rnntc", "rnnlm", "nmt"]

#: Axis names of a [batch, steps] tensor of token ids or labels.
_SEQ_AXES = ("sample", "length")


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _as_list(refs: TensorRef | list[TensorRef]) -> list[TensorRef]:
    """``GraphBuilder.add`` returns a bare ref for a single output; make it a list."""
    return refs if isinstance(refs, list) else [refs]


def _source(func: str, **kwargs: object) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"engine.models.rnn.{func}({args})"


def _split_steps(b: GraphBuilder, name: str, x: TensorRef, steps: int) -> list[TensorRef]:
    """Split ``x`` along axis 1 into ``steps`` tensors without that axis."""
    return _as_list(b.add("split", name, [x], axis=1, sizes=[1] * steps, squeeze=True))


def _embed_and_split(b: GraphBuilder, prefix: str, ids: TensorRef, vocab: int, hidden: int,
                     steps: int) -> list[TensorRef]:
    """Embedding lookup of ``ids`` [batch, steps], split into ``steps`` [batch, hidden] tensors."""
    emb = b.add("embedding", f"{prefix}.embedding", [ids], num_embeddings=vocab, embedding_dim=hidden)
    return _split_steps(b, f"{prefix}.split", emb, steps)  # steps x [batch, hidden]


def _lstm_step(b: GraphBuilder, prefix: str, t: int, xs: Sequence[TensorRef], hidden: int,
               state: list[tuple[TensorRef, TensorRef] | None]) -> TensorRef:
    """Add one step of every layer of a stacked LSTM; update ``state`` in place.

    ``state[l]`` is layer ``l``'s ``(h, c)`` from the previous step, or ``None`` for a zero
    initial state (the op then reads only its input). Returns the top layer's ``h_t``.
    """
    x = xs[t]
    for layer, prev in enumerate(state):
        inputs = [x] if prev is None else [x, prev[0], prev[1]]
        h, c = b.add("lstm", f"{prefix}.l{layer}.t{t}", inputs, hidden_size=hidden,
                     param_group=f"{prefix}.lstm{layer}", block=f"{prefix}.t{t}")
        state[layer] = (h, c)
        x = h
    return x


def rnntc(batch: int = 64, steps: int = 40, hidden: int = 1024, layers: int = 4, vocab: int = 32768,
          classes: int = 2, precision: str = "fp32") -> OpGraph:
    """RNN text classification (FlexFlow's RNNTC, SysML'19 Table 3), unrolled.

    Token ids [batch, steps] -> embedding -> ``layers`` stacked LSTMs over ``steps`` ->
    the top layer's last ``h`` -> linear to ``classes`` -> softmax cross-entropy.

    Parameters
    ----------
    batch, steps, hidden, layers, vocab, classes : int
        Global batch, unrolled steps, LSTM units, stacked LSTM layers, vocabulary size and
        number of classes.
    precision : str
        ``fp32``, ``fp16`` or ``bf16``: dtype of activations and parameters.

    Returns
    -------
    OpGraph
        ``layers * steps + 6`` ops; ``vocab*hidden + layers*(4*hidden*2*hidden + 4*hidden)
        + hidden*classes + classes`` parameters.

    Raises
    ------
    ValueError
        When a size is not a positive integer or the precision is unknown.

    Examples
    --------
    >>> g = rnntc(batch=2, steps=3, hidden=4, layers=1, vocab=10, classes=2)
    >>> len(g), g.param_count  # 10*4 + (4*4*(4+4) + 16) + (4*2 + 2)
    (9, 194)
    """
    _check_sizes(batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab, classes=classes)
    b = GraphBuilder(
        "rnntc", precision,
        description=f"RNN text classification (FlexFlow RNNTC): {layers}-layer LSTM, hidden {hidden}, "
                    f"{steps} steps, vocabulary {vocab}, {classes} classes",
        source=_source("rnntc", batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab,
                       classes=classes, precision=precision),
    )
    ids = b.input("tokens", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    labels = b.input("labels", [batch], dtype="int64", axes=("sample",))
    xs = _embed_and_split(b, "input", ids, vocab, hidden, steps)
    state: list[tuple[TensorRef, TensorRef] | None] = [None] * layers
    top = xs[0]
    for t in range(steps):
        top = _lstm_step(b, "lstm", t, xs, hidden, state)
    logits = b.add("linear", "classifier", [top], out_features=classes)  # [batch, classes]
    b.add("softmax_cross_entropy", "loss", [logits, labels])
    return b.build()


def rnnlm(batch: int = 64, steps: int = 40, hidden: int = 1024, layers: int = 2, vocab: int = 10000,
          precision: str = "fp32") -> OpGraph:
    """RNN language model (FlexFlow's RNNLM, SysML'19 Table 3), unrolled.

    Token ids [batch, steps] -> embedding -> ``layers`` stacked LSTMs; at every step the top
    ``h_t`` -> linear to ``vocab`` (one parameter set shared by all steps) -> softmax
    cross-entropy against that step's labels.

    Parameters
    ----------
    batch, steps, hidden, layers, vocab : int
        Global batch, unrolled steps, LSTM units, stacked LSTM layers and vocabulary size
        (Penn Treebank's 10k by default).
    precision : str
        ``fp32``, ``fp16`` or ``bf16``.

    Returns
    -------
    OpGraph
        ``layers * steps + 2 * steps + 5`` ops; ``vocab*hidden + layers*(8*hidden**2 +
        4*hidden) + hidden*vocab + vocab`` parameters.

    Raises
    ------
    ValueError
        When a size is not a positive integer or the precision is unknown.

    Examples
    --------
    >>> g = rnnlm(batch=2, steps=3, hidden=4, layers=1, vocab=10)
    >>> len(g), g.param_count  # 10*4 + 144 + (4*10 + 10)
    (14, 234)
    """
    _check_sizes(batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab)
    b = GraphBuilder(
        "rnnlm", precision,
        description=f"RNN language model (FlexFlow RNNLM): {layers}-layer LSTM, hidden {hidden}, "
                    f"{steps} steps, vocabulary {vocab}",
        source=_source("rnnlm", batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab,
                       precision=precision),
    )
    ids = b.input("tokens", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    labels = b.input("labels", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    xs = _embed_and_split(b, "input", ids, vocab, hidden, steps)
    ys = _split_steps(b, "labels.split", labels, steps)  # steps x [batch]
    state: list[tuple[TensorRef, TensorRef] | None] = [None] * layers
    for t in range(steps):
        top = _lstm_step(b, "lstm", t, xs, hidden, state)
        blk = f"lstm.t{t}"
        logits = b.add("linear", f"output.t{t}.logits", [top], out_features=vocab,
                       param_group="output.proj", block=blk)  # [batch, vocab]
        b.add("softmax_cross_entropy", f"output.t{t}.loss", [logits, ys[t]], block=blk)
    return b.build()


def nmt(batch: int = 64, steps: int = 40, hidden: int = 1024, layers: int = 2, vocab: int = 32768,
        precision: str = "fp32") -> OpGraph:
    """Neural machine translation with attention (FlexFlow's NMT, SysML'19 Table 3), unrolled.

    Source ids -> embedding -> ``layers``-layer LSTM encoder over ``steps``; its top layer's
    states form the memory [batch, steps, hidden]. Target ids -> their own embedding ->
    ``layers``-layer LSTM decoder, layer ``l`` starting from encoder layer ``l``'s final
    state. At every decoder step, with the top decoder state ``h_t`` (Luong et al. 2015,
    Eqs. 5, 7, 8, ``dot`` score):

    * scores = ``h_t`` [batch, 1, hidden] x memory^T -> [batch, 1, steps]; softmax;
    * context = weights x memory -> [batch, 1, hidden] -> [batch, hidden];
    * ``tanh(linear([context; h_t]))`` [batch, hidden] -> linear to ``vocab`` -> softmax
      cross-entropy against that step's target labels.

    The source and target sequences are both ``steps`` long.

    Parameters
    ----------
    batch, steps, hidden, layers, vocab : int
        Global batch, unrolled steps (per side), LSTM units, layers of encoder and of
        decoder, and vocabulary size (source and target each).
    precision : str
        ``fp32``, ``fp16`` or ``bf16``.

    Returns
    -------
    OpGraph
        ``2*layers*steps + 10*steps + 10`` ops (``steps == 1``: one fewer, no concat);
        parameters: two embeddings ``2*vocab*hidden``, ``2*layers`` LSTM layers of
        ``8*hidden**2 + 4*hidden``, the attention projection ``2*hidden*hidden + hidden``
        and the output projection ``hidden*vocab + vocab``.

    Raises
    ------
    ValueError
        When a size is not a positive integer or the precision is unknown.

    Examples
    --------
    >>> g = nmt(batch=2, steps=3, hidden=4, layers=1, vocab=10)
    >>> len(g), g["decoder.t0.scores"].out_tensors[0].shape
    (46, (2, 1, 3))
    """
    _check_sizes(batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab)
    b = GraphBuilder(
        "nmt", precision,
        description=f"Neural machine translation (FlexFlow NMT): {layers}-layer LSTM encoder and decoder "
                    f"with dot attention, hidden {hidden}, {steps} steps, vocabulary {vocab}",
        source=_source("nmt", batch=batch, steps=steps, hidden=hidden, layers=layers, vocab=vocab,
                       precision=precision),
    )
    src = b.input("source", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    tgt = b.input("target", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    labels = b.input("labels", [batch, steps], dtype="int64", axes=_SEQ_AXES)
    src_xs = _embed_and_split(b, "encoder", src, vocab, hidden, steps)
    tgt_xs = _embed_and_split(b, "decoder", tgt, vocab, hidden, steps)
    ys = _split_steps(b, "labels.split", labels, steps)  # steps x [batch]

    # Encoder.
    state: list[tuple[TensorRef, TensorRef] | None] = [None] * layers
    enc_top = [_lstm_step(b, "encoder", t, src_xs, hidden, state) for t in range(steps)]
    # Memory: concatenating the [batch, hidden] states along axis 1 puts h_t at columns
    # t*hidden .. (t+1)*hidden, so a row-major reshape gives memory[:, t, :] = h_t.
    flat = enc_top[0] if steps == 1 else b.add("concat", "encoder.states", enc_top, axis=1)  # [batch, steps*hidden]
    memory = b.add("reshape", "encoder.memory", [flat], shape=[batch, steps, hidden],
                   axes=["sample", "length", "feature"])  # [batch, steps, hidden]

    # Decoder: layer l starts from encoder layer l's final (h, c); `state` holds them now.
    for t in range(steps):
        h = _lstm_step(b, "decoder", t, tgt_xs, hidden, state)
        p, blk = f"decoder.t{t}", f"decoder.t{t}"
        q = b.add("reshape", f"{p}.query", [h], shape=[batch, 1, hidden],
                  axes=["sample", "query", "feature"], block=blk)  # [batch, 1, hidden]
        scores = b.add("batch_matmul", f"{p}.scores", [q, memory], transpose_b=True, block=blk)  # [batch, 1, steps]
        weights = b.add("softmax", f"{p}.weights", [scores], axis=-1, block=blk)
        ctx = b.add("batch_matmul", f"{p}.context", [weights, memory], block=blk)  # [batch, 1, hidden]
        ctx = b.add("reshape", f"{p}.context2d", [ctx], shape=[batch, hidden],
                    axes=["sample", "feature"], block=blk)  # [batch, hidden]
        cat = b.add("concat", f"{p}.concat", [ctx, h], axis=1, block=blk)  # [batch, 2*hidden]
        att = b.add("linear", f"{p}.attn_proj", [cat], out_features=hidden,
                    param_group="decoder.attn_proj", block=blk)  # [batch, hidden]
        att = b.add("tanh", f"{p}.attn_tanh", [att], block=blk)
        logits = b.add("linear", f"{p}.logits", [att], out_features=vocab,
                       param_group="decoder.output_proj", block=blk)  # [batch, vocab]
        b.add("softmax_cross_entropy", f"{p}.loss", [logits, ys[t]], block=blk)
    return b.build()
