"""``encode_prompts`` for Z-Image and FLUX.2: the file's rows are what ``ZImagePipeline``,
``Flux2Pipeline`` ([dev]) and ``Flux2KleinPipeline`` ([klein]) compute in their own
``encode_prompt``, on tiny random text encoders built from configs (Qwen3 for Z-Image and
[klein], Mistral 3 for [dev]) with byte-level tokenizers and chat templates written here (no
downloads), saved as pipeline folders and loaded back as the tool loads them.

Z-Image's pipeline returns each prompt's real tokens alone; the file pads them (zeros, a False
mask) and the Z-Image transformer takes exactly the masked-in tokens: the file's rows through a
run's prompt source and our converted transformer equal diffusers' transformer fed the
pipeline's list (the guidance null prompt included). FLUX.2's rows are the tokenizer's padded
``max_sequence_length`` tokens, every one attended.

[dev]'s tokenizer here is a plain tokenizer carrying a Mistral-style chat template: the real
folder's ``PixtralProcessor`` (which renders the same chat and tokenizes it with its tokenizer
when no image is given) is built by transformers only with torchvision, which this environment
lacks; loading a folder that names it says so in one line. Needs torch, transformers and
diffusers (the ``[encode]`` extra)."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

from test_encode_prompts import TOL, qwen_tokenizer, reference, run_tool  # noqa: E402

from spotlight_jax import prompt_embeddings as pe  # noqa: E402
from spotlight_jax.prompt_embeddings import encoders  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "diffusers"
PROMPTS = ["a red bar", 'two blue squares and the text "42"', "a green column"]

# Qwen3's chat as the pipelines render it: each turn in <|im_start|>role ... <|im_end|>, then the
# assistant's turn opened; with thinking off an empty think block follows (Flux2Klein), with it
# on (Z-Image) nothing does
QWEN3_CHAT = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}")
# a Mistral-style chat over Flux2Pipeline's messages (content lists of text parts): the system
# prompt in its markers, each user turn in [INST] ... [/INST]
MISTRAL_CHAT = (
    "{{ bos_token }}{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ m['content'][0]['text'] }}"
    "[/SYSTEM_PROMPT]"
    "{%- else %}[INST]{%- for part in m['content'] %}{{ part['text'] }}{%- endfor %}[/INST]"
    "{%- endif %}{%- endfor %}")


def qwen3_tokenizer():
    tok = qwen_tokenizer()
    tok.chat_template = QWEN3_CHAT
    return tok


def qwen3_config(tok, width, layers):
    return dict(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                head_dim=width // 2, max_position_embeddings=1024,
                pad_token_id=tok.pad_token_id)


def z_image_pipeline(width=16):
    """Qwen3 (the base model, as Z-Image's ``text_encoder``) of ``width`` (16: the Z-Image
    transformer fixture's ``cap_feat_dim``), 2 layers (the pipeline takes the second-to-last
    hidden state)."""
    tok = qwen3_tokenizer()
    torch.manual_seed(7)
    encoder = transformers.Qwen3Model(transformers.Qwen3Config(**qwen3_config(tok, width, 2)))
    return diffusers.ZImagePipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                    vae=None, text_encoder=encoder.eval(), tokenizer=tok,
                                    transformer=None)


def klein_pipeline(width=8):
    """Qwen3 with a language-model head (FLUX.2 [klein]'s ``text_encoder``), 28 layers so that
    the pipeline's layers 9, 18 and 27 exist: rows 3 x ``width`` wide."""
    tok = qwen3_tokenizer()
    torch.manual_seed(8)
    encoder = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**qwen3_config(tok, width,
                                                                                     28)))
    return diffusers.Flux2KleinPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                        vae=None, text_encoder=encoder.eval(), tokenizer=tok,
                                        transformer=None)


def mistral_tokenizer():
    """A byte-level BPE with Mistral's chat markers as special tokens (and Pixtral's image
    markers, which ``Mistral3Config`` refers to)."""
    from tokenizers import pre_tokenizers
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("e", "d"), ("\u0120", "a"), ("\u0120", "t")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None,
                                      bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.add_special_tokens({"additional_special_tokens": [
        "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]",
        "[IMG_END]"]})
    tok.chat_template = MISTRAL_CHAT
    return tok


def dev_pipeline(width=8):
    """Mistral 3 (a Pixtral vision tower and a Mistral language model, FLUX.2 [dev]'s
    ``text_encoder``) with 31 text layers, so that the pipeline's layers 10, 20 and 30 exist:
    rows 3 x ``width`` wide (24: the FLUX.2 [dev] transformer fixture's
    ``joint_attention_dim``)."""
    tok = mistral_tokenizer()
    torch.manual_seed(9)
    cfg = transformers.Mistral3Config(
        text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=width,
                         intermediate_size=2 * width, num_hidden_layers=31,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=width // 2,
                         max_position_embeddings=1024, pad_token_id=tok.pad_token_id),
        vision_config=dict(model_type="pixtral", hidden_size=8, intermediate_size=16,
                           num_hidden_layers=1, num_attention_heads=2, head_dim=4,
                           image_size=32, patch_size=16),
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1)
    encoder = transformers.Mistral3ForConditionalGeneration(cfg).eval()
    return diffusers.Flux2Pipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                   vae=None, text_encoder=encoder, tokenizer=tok,
                                   transformer=None)


def z_image_reference(pipe, prompts, batch_size, length, msl):
    """The pipeline's ``encode_prompt`` of the tool's batches: each prompt's list entry (its
    real tokens), padded to ``length``."""
    def encode(batch):
        rows, _ = pipe.encode_prompt(list(batch), do_classifier_free_guidance=False,
                                     max_sequence_length=msl)
        return rows, None, None

    out, masks = [], []
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            rows, _, _ = encode(prompts[i:i + batch_size])
            out += [r.numpy() for r in rows]
            masks += [np.ones(len(r), bool) for r in rows]
    return pe.pad_rows(out, masks, length)


def test_z_image_file_equals_the_pipelines_encode_prompt(tmp_path):
    """Through the command line: Qwen3's second-to-last states of each prompt's real tokens,
    rows of different lengths padded with zeros and a False mask; the tool prints the run's
    flags for the folder."""
    pipe = z_image_pipeline()
    pipe.save_pretrained(tmp_path / "Z-Image")
    (tmp_path / "train.txt").write_text("\n".join(PROMPTS[:2]) + "\n")
    (tmp_path / "val.txt").write_text(PROMPTS[2] + "\n")
    path = tmp_path / "z.safetensors"
    out = run_tool(f"--pipeline={tmp_path / 'Z-Image'}", f"--output={path}",
                   f"--prompts={tmp_path / 'train.txt'}", f"--val_prompts={tmp_path / 'val.txt'}",
                   "--batch_size=2", "--max_sequence_length=64")
    f = pe.read(path)
    assert f.family == "z_image" and f.pooled is None and "Qwen3Model" in f.encoder
    assert f.prompts("train") == PROMPTS[:2] and f.prompts("val") == PROMPTS[2:]
    assert (f"--config.base_checkpoint={tmp_path / 'Z-Image'} --config.model.text_len="
            f"{f.text_len} --config.prompts.embeddings_file={path}") in out.stdout
    embeds, mask = z_image_reference(pipe, ["", *PROMPTS], 2, f.text_len, 64)
    np.testing.assert_array_equal(f.mask, mask)
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    lengths = f.mask.sum(1)
    # the chat template's tokens around each prompt: every row has real tokens, of its length
    assert len(set(lengths.tolist())) == 4 and f.text_len == lengths.max() < 64
    assert not f.embeds[~f.mask].any() and f.mask[:, 0].all()


def test_z_image_rows_reach_the_transformer_as_the_pipeline_feeds_it(tmp_path):
    """The file's rows, padded to a longer ``text_len`` by a run's prompt source, through the
    converted Z-Image fixture transformer (the prompts and their guidance null rows in one
    batch, as a guided rollout calls it) equal diffusers' transformer fed the pipeline's list
    of real-token states, timestep ``1 - sigma``, output negated (``ZImagePipeline``'s call),
    to 1e-5 with a correctly rounded ``exp`` (``make_z_image_fixture``)."""
    import jax
    from flax import nnx

    from spotlight_jax.diffusion import prompt
    from spotlight_jax.models.convert import z_image as convert_z_image
    from spotlight_jax.models.convert.diffusers_folder import read_component

    spec = importlib.util.spec_from_file_location("make_z_image_fixture",
                                                  FIXTURES / "make_z_image_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    pipe = z_image_pipeline()
    path = tmp_path / "z.safetensors"
    encoders.encode_to_file(pipe, path, PROMPTS, batch_size=3)
    f = pe.read(path)
    text_len = f.text_len + 9                            # the run pads further: never seen
    tokens, mask = pe.EmbeddingPrompts(f).tokenize(PROMPTS[:2], text_len)
    null = tokens[prompt.NULL]
    embeds = np.concatenate([tokens[prompt.EMBEDS], null[prompt.EMBEDS]])
    masks = np.concatenate([mask, null[prompt.MASK]])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 10, 14, 4)).astype(np.float32)
    t = np.asarray([0.75, 0.25, 0.75, 0.25], np.float32)
    model, _ = convert_z_image.z_image_model(*read_component(FIXTURES / "transformer"
                                                              / "z_image"))
    forward = nnx.jit(lambda m, *a: m(*a))
    with jax.default_matmul_precision("highest"):
        ours = np.asarray(forward(model, x, t, embeds, masks))
        # the mask matters: with every padded row taken as real the velocity moves
        unmasked = np.asarray(forward(model, x, t, embeds, np.ones_like(masks)))
    assert np.abs(unmasked - ours).max() > 1e-3

    # diffusers, fed as the pipeline feeds it: the list encode_prompt returns
    with torch.no_grad():
        caps, negative = pipe.encode_prompt(PROMPTS[:2], do_classifier_free_guidance=True,
                                            max_sequence_length=512)
    caps = [*caps, *negative]
    assert [len(c) for c in caps] == masks.sum(1).tolist()
    reference_model = diffusers.ZImageTransformer2DModel.from_pretrained(
        FIXTURES / "transformer" / "z_image", torch_dtype=torch.float32).eval()

    def call(inp):                     # make_z_image_fixture.reference with the caps given
        latents = torch.from_numpy(inp["x"]).permute(0, 3, 1, 2).unsqueeze(2)
        with torch.no_grad():
            out = reference_model(list(latents.unbind(0)), 1.0 - torch.from_numpy(inp["t"]),
                                  caps, return_dict=False)[0]
        return (-torch.stack(out, 0).squeeze(2)).permute(0, 2, 3, 1).numpy()

    from unittest import mock
    with mock.patch.object(gen, "reference", lambda model, inp: call(inp)):
        want = gen.reference_rounded_exp(reference_model, {"x": x, "t": t})
    assert float(np.abs(want).max()) > 0.5
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-5)
    # the prompts matter: the null rows' velocity differs from theirs
    assert np.abs(ours[:2] - ours[2:]).max() > 1e-2


def test_flux2_klein_file_equals_the_pipelines_encode_prompt(tmp_path):
    """The library path (load the folder, encode, write): Qwen3's layers 9, 18, 27 stacked per
    token, every row the tokenizer's ``max_sequence_length`` tokens, all attended."""
    pipe = klein_pipeline()
    pipe.save_pretrained(tmp_path / "FLUX.2-klein")
    loaded = encoders.load_pipeline(tmp_path / "FLUX.2-klein")
    assert loaded.transformer is None and loaded.vae is None
    path = tmp_path / "klein.safetensors"
    encoders.encode_to_file(loaded, path, PROMPTS, batch_size=2, max_sequence_length=40)
    f = pe.read(path)
    assert f.family == "flux2_klein" and f.pooled is None and "Qwen3ForCausalLM" in f.encoder
    assert f.info["text_encoder_out_layers"] == [9, 18, 27]
    assert f.info["max_sequence_length"] == 40

    def encode(batch):
        e, _ = pipe.encode_prompt(list(batch), max_sequence_length=40)
        return e, None, None

    embeds, _, _ = reference(encode, ["", *PROMPTS], 2, 40)
    assert embeds.shape == (4, 40, 3 * 8) and f.mask.all()
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    assert np.abs(f.embeds[1] - f.embeds[2]).max() > 1e-3


def test_flux2_dev_file_equals_the_pipelines_encode_prompt(tmp_path):
    """Through the command line: Mistral 3's layers 10, 20, 30 of the system message and the
    prompt, stacked per token, ``max_sequence_length`` tokens per row, all attended; the tool
    prints the run's flags (``text_len`` exactly the file's)."""
    pipe = dev_pipeline()
    pipe.save_pretrained(tmp_path / "FLUX.2-dev")
    (tmp_path / "train.txt").write_text("\n".join(PROMPTS) + "\n")
    path = tmp_path / "dev.safetensors"
    out = run_tool(f"--pipeline={tmp_path / 'FLUX.2-dev'}", f"--output={path}",
                   f"--prompts={tmp_path / 'train.txt'}", "--batch_size=3",
                   "--max_sequence_length=256")
    f = pe.read(path)
    assert f.family == "flux2" and "Mistral3ForConditionalGeneration" in f.encoder
    assert f.info["text_encoder_out_layers"] == [10, 20, 30]
    assert (f"--config.base_checkpoint={tmp_path / 'FLUX.2-dev'} --config.model.text_len=256 "
            f"--config.prompts.embeddings_file={path}") in out.stdout

    def encode(batch):
        e, _ = pipe.encode_prompt(list(batch), max_sequence_length=256)
        return e, None, None

    embeds, _, _ = reference(encode, ["", *PROMPTS], 3, 256)
    assert embeds.shape == (4, 256, 24) and f.mask.all()
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    # the system message fits in 256 tokens: the prompts are in the rows, not truncated away
    assert np.abs(f.embeds[1] - f.embeds[2]).max() > 1e-3
    # in 64 it does not: every prompt would be the empty one's row, which the tool refuses
    with pytest.raises(pe.PromptEmbeddingError, match=r"prompt 'a red bar': its embeddings "
                                                      r"equal the empty prompt's \(3 such\): "
                                                      r"max_sequence_length=64 tokens leave none"):
        encoders.encode_to_file(pipe, tmp_path / "short.safetensors", PROMPTS,
                                max_sequence_length=64)


def test_a_flux2_dev_folder_with_pixtrals_processor_needs_torchvision(tmp_path):
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the processor loads")
    (tmp_path / "model_index.json").write_text(json.dumps({
        "_class_name": "Flux2Pipeline", "tokenizer": ["transformers", "PixtralProcessor"]}))
    with pytest.raises(ImportError, match=r"a Flux2Pipeline loads its tokenizer as a "
                                          r"PixtralProcessor, which transformers builds only "
                                          r"with torchvision: pip install torchvision"):
        encoders.load_pipeline(tmp_path)
