"""Base config shared by every variant: the tiny CPU model on the synthetic world.

Variants import `get_config()` from here and override fields; they never copy it.
Run:  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/spotlight
"""
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    # baseline | explore_sync | spot_rollout | spotlight | spotlight_pipelined | compare
    c.mode = "spotlight"
    # Emulated devices when running on CPU in the spot modes (0 = leave as is; baseline and
    # explore_sync use one: RunSpec.cpu_device_count): the deployment below (4 on-demand
    # + 4 spot nodes of 2) needs 12 for the scheduler's pool to hold it device for device.
    c.num_cpu_devices = 12
    # Devices of the trainer's mesh (0 = all). On CPU the emulated devices share the cores: a
    # data-parallel update over 8 is far slower than on one, over 2 (one per core, baseline and
    # explore_sync modes) an iteration is a little faster (docs/performance.md).
    c.trainer_devices = 1
    # JAX persistent compilation cache: restarted processes and rejoining nodes load compiled
    # programs instead of compiling them ("" = off).
    c.compilation_cache_dir = "~/.cache/spotlight_jax/xla"
    c.base_checkpoint = "auto"      # 'auto' = shipped checkpoint for this config if present

    # Model (spotlight_jax.models.MMDiTConfig)
    m = c.model = ml_collections.ConfigDict()
    m.image_size = 32
    m.channels = 3
    m.patch_size = 4
    m.width = 128
    m.depth = 4
    m.num_heads = 4
    m.mlp_ratio = 3.0
    m.qk_norm = True
    m.vocab_size = 64
    m.text_len = 16
    m.text_width = 64
    m.text_layers = 2
    m.text_heads = 2
    m.text_embed_dim = 0
    m.conv_stem = 16
    m.conv_head = True
    m.pixel_head = 0                # full-resolution conv decoder channels (0 = off)
    m.dtype = "float32"
    m.param_dtype = "float32"
    m.remat = False
    m.remat_policy = "nothing"      # nothing | attention | dots_no_batch | dots_attention | dots
    #                                 (models.mmdit.REMAT_POLICIES: what a block keeps)
    m.scan_blocks = False
    # Options of the model families a diffusers checkpoint brings (models.convert sets them from
    # its config.json; configs/qwen_image.py and configs/sd35_medium.py name them for dry runs).
    m.pos_embed = "sincos"          # sincos | sd3_table | rope3d (Qwen-Image) | rope3d_flux
    m.pos_embed_max_size = 0        # sd3_table: the stored table's grid side
    m.pos_embed_base_size = 0       # sd3_table: diffusers' base_size (sample_size // patch)
    m.pos_embed_dtype = "float32"   # sd3_table: the dtype the checkpoint stores the table in
    m.rope_axes = (16, 56, 56)      # rope3d: head_dim split into (frame, height, width)
    m.rope_theta = 10_000.0
    m.pooled = "text_mean"          # text_mean | input (SD3's pooled_dim input) | none
    m.pooled_dim = 0
    m.text_norm = False             # RMSNorm on the text embeddings (Qwen-Image)
    m.use_text_mask = True          # False: every text token attended (SD3)
    m.context_pre_only_last = False  # SD3: the last block's text stream only feeds k/v
    m.dual_attention_layers = ()    # SD3.5: blocks with a second, image-only attention
    m.single_blocks = 0             # Flux: single-stream blocks after the `depth` dual ones
    m.guidance_embed = False        # FLUX.1 [dev]: sampler.guidance is a model input (no CFG)
    m.timestep_scaling = "before_freqs"  # before_freqs (ours, SD3) | after_freqs (Qwen-Image)
    m.timestep_freqs = "jnp"        # jnp | rounded (diffusers' float32 rounding, for parity)
    m.reference_images = 0          # editing: input images a call may pass (Qwen-Image-Edit: 1)
    m.reference_zero_t = False      # Qwen-Image-Edit-2511: reference tokens modulated at t = 0

    # Device layout (spotlight_jax.parallel.MeshConfig) and attention strategy.
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, sp=1))
    c.attention = "dense"           # dense | ulysses | ring | usp
    c.attention_impl = "auto"       # auto (splash on TPUs, cuDNN where it runs, else XLA)
    #                                 | xla | cudnn | splash


    # Flow-matching pretraining of the base model.
    p = c.pretrain = ml_collections.ConfigDict()
    p.steps = 2400
    p.batch_size = 64
    p.lr = 1e-3
    p.warmup = 100
    p.end_lr_frac = 0.1
    p.weight_decay = 0.0
    p.t_sampling = "logit_normal"
    p.t_shift = 3.0                 # push training weight toward high noise (layout regime)
    p.prompt_dropout = 0.1
    p.ema = 0.999
    p.eval_every = 400
    p.eval_prompts = 48
    p.eval_seeds = 2
    p.grad_clip = 1.0
    p.init_from = ""                # grow from this checkpoint's matching parameters ("" = scratch)
    p.kinds = ""                    # curriculum: only these task kinds, e.g. "position" ("" = all)
    p.t_min = 0.0                   # curriculum: only flow times t >= t_min (layout regime)

    # Sampler (spotlight_jax.diffusion.SamplerConfig).
    s = c.sampler = ml_collections.ConfigDict()
    s.num_steps = 10
    s.shift = 3.0
    s.noise_level = 0.7
    s.sde_type = "sde"
    s.guidance = 1.0
    # SDE (and trained) steps [start, end), slice-style: (0, -2) = all but the last two, which
    # are ODE steps. Their tiny std makes their log-prob gradients (eps / std) hold most of the
    # update's gradient energy while their noise only moves fine detail
    # (python -m spotlight_jax.studies.grpo_gradient; docs/flow_grpo.md). None = every step.
    s.sde_window = ml_collections.config_dict.placeholder(tuple)
    s.sde_window = (0, -2)
    # True: a prompt's rollouts (and exploration candidates) share their initial noise x_T and
    # differ only in SDE noise (DanceGRPO's switch; here x_T explains little of a group's reward
    # spread at noise level 0.7, docs/flow_grpo.md)
    s.shared_initial_noise = False
    # > 1: block noise — SDE steps diffuse only the images constant on p x p pixel blocks
    # (marginals kept; a policy over HWC/p^2 dimensions; spotlight_jax.diffusion.sde_step).
    # 2 measured best of 1, 2 and 4 (one model patch) under Flow-GRPO (docs/flow_grpo.md).
    # 1 = per-pixel noise (Flow-GRPO's SDE).
    s.noise_patch = 2
    # Per-step block sizes, one per step (overrides noise_patch; None = noise_patch everywhere),
    # e.g. (4, 4, 4, 2, 2, 2, 2, 2, 2, 2): coarse blocks where the layout forms, finer later.
    s.noise_patches = ml_collections.config_dict.placeholder(tuple)
    s.eval_steps = 20
    s.eval_guidance = 1.0           # the held-out sampler's CFG scale (1 = none), whatever
    #                                 sampler.guidance the training rollouts use

    # RL post-training. rl.objective: 'flow_grpo' (spotlight_jax.rl.GRPOConfig: SDE rollouts,
    # score-function gradient) | 'nft' (spotlight_jax.rl.nft.NFTConfig: ODE rollouts from a
    # lagging sampling policy, reward-weighted flow matching on the finished images; rl.nft.*).
    r = c.rl = ml_collections.ConfigDict()
    r.objective = "nft"             # measured: docs/objectives.md
    r.iterations = 1000
    # RL compute budget: rollouts + updates + exploration, not evaluation or start-up. 12 keeps
    # the demo (spotlight mode with three evaluations) within 15 minutes on 2 CPU cores.
    r.max_minutes = 12.0
    r.prompts_per_iter = 8
    r.group_size = 8
    # training reward; None = the objective's default (each the best measured for it:
    # docs/objectives.md): nft geneval_lite_aspect (shape credit also slopes toward the asked
    # elongation), flow_grpo geneval_lite; geneval_lite_shaped: graded text credit
    r.reward = ml_collections.config_dict.placeholder(str)
    r.eval_reward = "geneval_lite"  # held-out measurement ('' = rl.reward)
    # LoRA lr; None = the objective's default: flow_grpo 5e-4, nft 1e-3 (each the best of the
    # measured settings: docs/flow_grpo.md, docs/objectives.md)
    r.lr = ml_collections.config_dict.placeholder(float)
    r.beta = 0.01
    # KL weight of the within-block detail, which block noise leaves without a policy gradient
    # (rl.grpo.GRPOConfig.detail_beta; None = rl.beta)
    r.detail_beta = ml_collections.config_dict.placeholder(float)
    r.clip_eps = 1e-3
    r.adv_clip = 5.0
    # advantages' std over the whole batch (True) or each group (False); None = the
    # objective's default (nft: batch, flow_grpo: group)
    r.global_std = ml_collections.config_dict.placeholder(bool)
    # 'reward': advantages of the scalar reward; 'decoupled': each of geneval_lite's
    # constraints normalised within its group on its own, then averaged (rl.grpo)
    r.advantage = "reward"
    r.train_steps = 0               # timesteps trained per trajectory (0 = all SDE steps)
    # 'uniform' (Flow-GRPO) | 'score': each trained step's policy term scaled by 1 / its score
    # factor, so the early (layout) steps push as hard as the late small-std ones
    # (rl.grpo.step_weights; docs/flow_grpo.md)
    r.step_weight = "uniform"
    r.inner_epochs = 1
    r.minibatches = 2
    r.rescore = False               # re-score old log-probs (one more forward; see GRPOConfig)
    r.grad_clip = 1.0
    r.weight_decay = 1e-4
    r.lora_rank = 16                # 0 = full fine-tuning
    r.lora_alpha = 32.0
    r.ema = 0.0                     # EMA of the policy for evaluation (0 = off)
    r.eval_every = 40
    r.eval_prompts = 64
    r.eval_seeds = 8
    # The forward-process objective (rl.objective='nft'; shares lr, LoRA, grad_clip,
    # weight_decay, ema, adv_clip, global_std, advantage with the section above).
    n = r.nft = ml_collections.ConfigDict()
    n.beta = 1.0                    # trust region of the implicit policies (0.1: text rewards)
    n.kl_beta = 0.0                 # weight of mean((v - v_base)^2)
    n.times = 4                     # flow times per image, stratified over the sampler's grid
    n.shared_noise = True           # one (t, eps) per group and slot (DGPO); False: per image
    n.eta_rate = 0.01               # sampling policy lag eta_k = min(eta_rate * k, eta_max)
    n.eta_max = 0.5
    n.eta_delay = 0                 # iterations fully on-policy before the lag ramps up
    n.minibatches = 1               # gradient accumulation chunks of the one step per iteration
    # v_old of a batch an older policy drew (spotlight_pipelined's ready batch): 'current' (the
    # current sampling policy theta_old; measured: docs/spotlight_measurements.md) or 'sampler'
    # (the policy that drew it)
    n.anchor = "current"

    # Prompt embeddings of a real text encoder (model.text_width=0): a file written by
    # python -m spotlight_jax.tools.encode_prompts; its train/val splits are the run's prompts
    # ("" = the synthetic world's prompts and tokenizer, for a model with a prompt encoder).
    c.prompts = ml_collections.ConfigDict(dict(embeddings_file=""))
    # RL training pool restricted to these task kinds of the synthetic world, comma-separated
    # (e.g. "two_object,position"; "" = every kind); held-out evaluation keeps every kind.
    c.prompts.train_kinds = ""

    # Learned rewards in JAX, in process (spotlight_jax.rewards.learned; docs/rewards.md), used
    # where rl.reward or rl.eval_reward names (or mixes in) clip_score, pickscore, aesthetic or
    # hpsv2: transformers CLIPModel folders (weights as safetensors, tokenizer.json), the
    # converted aesthetic head and HPSv2.1's converted open_clip weights
    lr = c.learned_rewards = ml_collections.ConfigDict()
    lr.clip_dir = ""                # clip_score: e.g. openai/clip-vit-large-patch14
    lr.pickscore_dir = ""           # pickscore: yuvalkirstain/PickScore_v1 (+ the CLIP-H tokenizer)
    lr.aesthetic_clip_dir = ""      # aesthetic: CLIP ViT-L/14 (the predictor's embedding)
    lr.aesthetic_head = ""          # aesthetic: the head converted to .safetensors
    lr.hpsv2_weights = ""           # hpsv2: HPS_v2.1_compressed.pt converted to .safetensors
    lr.hpsv2_tokenizer_dir = ""     # hpsv2: a folder with the ViT-H/14 tokenizer.json
    lr.batch_size = 32              # images per jitted call

    # A reward served over HTTP (spotlight_jax.rewards.remote; docs/rewards_remote.md), used
    # where rl.reward or rl.eval_reward is 'remote'. While the server is unreachable the run
    # pauses and retries (back-off) for up to max_wait_s, then stops with an error.
    w = c.remote_reward = ml_collections.ConfigDict()
    w.url = ""                      # e.g. http://127.0.0.1:18085 ('' = none)
    w.protocol = "json"             # json (ours, safe) | flow_grpo_pickle (Flow-GRPO's servers)
    w.trust_pickle = False          # flow_grpo_pickle: unpickling a reply runs the server's code
    w.image_format = "png"          # json: png (lossless 8-bit) | jpeg | npy (float32, exact)
    w.jpeg_quality = 95             # jpeg and flow_grpo_pickle (Flow-GRPO's client: 75)
    w.batch_size = 64               # images per request
    w.timeout_s = 120.0             # per request
    w.backoff_s = 1.0               # first wait after a failed attempt, doubling ...
    w.max_backoff_s = 60.0          # ... up to this
    w.max_wait_s = 600.0            # per request; 0 = wait for the server forever

    c.checkpoint = ml_collections.ConfigDict(dict(every=10, max_to_keep=3))
    # Where rl.jsonl's scalars and the sample grids also go: TensorBoard always (workdir/tb);
    # Weights & Biases with wandb='offline' (no account; `wandb sync workdir/wandb/...` later)
    # or 'online' (pip install -e '.[wandb]').
    c.logging = ml_collections.ConfigDict(dict(wandb="off", wandb_project="spotlight_jax"))
    return add_spotlight_sections(c)


def add_spotlight_sections(c):
    """Exploration, deployment, trace and cost sections (used by every mode but baseline)."""
    e = c.explore = ml_collections.ConfigDict()
    e.algorithm = "ucb"             # planner: ucb | thompson | uniform (study: studies.planner)
    e.max_extra_per_prompt = 24     # pool is at most group_size + this
    e.sync_extra_per_prompt = 8     # explore_sync: extra candidates per prompt (critical path)
    e.cluster_by_kind = True        # bandit arms = task kinds (prompts recur rarely)
    e.budget_frac = 1.0             # share of the spot time during training given to exploring

    d = c.deployment = ml_collections.ConfigDict()
    d.on_demand_devices = 4         # paper: 4 reserved H100 on one node
    d.spot_nodes = 4                # paper: 8 spot H100 = 4 nodes of 2
    d.spot_devices_per_node = 2
    d.spot_sp = 2                   # SP degree of a spot group (one group per node)
    # a TPU (cost.device): the topology of every spot slice ('2x4', '2x2x1': a spot node is
    # one slice, lost whole; spot_devices_per_node = its chips; trace.cloud = 'gcp', 30 s
    # notice; emulation.slices); '' = GPU nodes of spot_devices_per_node devices
    d.spot_slice = ""
    d.commit_every = 2              # periodic commits of in-flight rollouts (abrupt losses)
    # spotlight modes: the update cut into gradient shards that the spot groups help compute
    # (runner/shared_update.py): 'off' | 'fixed' (they may take update_spot_share of the
    # shards) | 'auto' (the share with the shortest critical path; exploration gets the rest)
    # | 'payoff' (the share with the least time per unit of progress: the planner's expected
    # selection gain g over the base variance v, progress (1 + g / v) ** update_payoff_exponent)
    d.shared_update = "off"
    d.update_spot_share = 1.0
    d.update_shards = 8             # shards per optimizer step (divides its images/trajectories)
    # 0.75: fitted to explore_sync's measured iteration savings (docs/spotlight.md, the payoff
    # split): pools of 2G / 4G, variance ratios 1.63 / 2.06, 1.43x / 1.67-1.75x fewer iterations
    d.update_payoff_exponent = 0.75
    # spotlight, emulated transport: the spot nodes are a SpotFleet of emulated devices that the
    # trace's preemptions and joins really regroup (weights deleted / pulled device-to-device,
    # programs precompiled per node) and that runs the exploration (spotlight_jax.spot_fleet)
    d.fleet = True
    # spot_rollout / spotlight: run each iteration's rollouts through the pull scheduler
    # (spotlight_jax.sched: leases, commits, preemptions from the trace) on the emulated pool
    d.scheduler = True
    # scheduled rollouts: "true" = each SP group computes its requests on its own devices (the
    # weights placed on them when it forms, one segment program per group layout); "false" = every
    # group computes on the trainer's device (one program) and differs only in identity and
    # speed; "auto" = "true" except on the CPU backend, whose emulated devices share the cores
    # (slower there: docs/performance.md)
    d.rollout_on_groups = "auto"
    # 'emulated': spot groups are emulated devices in this process; 'ray': the spot modes'
    # rollouts and exploration run on Ray spot host actors (real processes; needs the cluster
    # extra and a Ray cluster, or starts a local one), preempted by real signals, not the trace
    d.transport = "emulated"
    # 'ray': the custom resource a node must advertise to host a spot actor ('' = any node;
    # the launch scripts give spot machines "spot_node")
    d.ray_spot_resource = ""
    # 'ray': the cluster to join ('' = the RAY_ADDRESS environment variable, else a new local
    # instance with one CPU per spot host)
    d.ray_address = ""
    # 'ray': seconds a phase waits for the spot hosts it just started (0: none; hosts still
    # starting join a later phase; on a local instance started by the run: until they are up)
    d.ray_host_wait_s = 0.0
    # 'ray': a host compiles, after joining, the programs of the groups it would regroup into
    # after losing one device (its own devices; background CPU work), so a regroup compiles 0
    d.spot_regroup_precompile = True
    # 'ray', spotlight modes: drop the exploration candidates not finished when the update ends
    # (exploration never lengthens the critical path); false = a fixed plan, every candidate
    # scored (the trainer's devices finish what no host can)
    d.ray_explore_deadline = True

    t = c.trace = ml_collections.ConfigDict()
    # SkyPilot JSON, or comma-separated 1-node files merged into a pool of nodes; empty =
    # synthetic Poisson trace below
    t.path = ""
    t.start_s = 0.0                 # replay t.path from this time on (e.g. its busy hour)
    t.rate_per_node_hour = 2.0      # synthetic preemptions per spot node-hour
    t.mean_outage_s = 600.0         # synthetic mean outage length
    t.cloud = "aws"                 # notice lead time preset: aws 120 s, gcp 30 s, alibaba 300 s
    t.abrupt_fraction = 0.2         # share of preemptions without notice
    t.seed = 0

    # Cost model, deployment profile and prices (spotlight_jax.emulation.cost_models.CostConfig;
    # every number not derived is an assumption with its source).
    k = c.cost = ml_collections.ConfigDict()
    k.model = "profile"             # profile | measured (emulation.cost_models.COST_MODELS)
    # --- accelerator and achieved efficiency -------------------------------------------------
    k.device = "h100_sxm"           # key of emulation.datasheets.DEVICES (peak numbers + sources);
    #                                 the paper reports 4 reserved + 8 spot H100
    k.mfu = 0.4                     # ASSUMPTION: achieved/peak bf16 FLOP/s of a large DiT step;
    #                                 typical of well-tuned large-transformer training (PaLM
    #                                 reports 46%, MegaScale 55%); not measured for this model
    k.rollout_mfu = 0.0             # per-phase MFUs (0 = cost.mfu): a rollout step, an update
    k.update_mfu = 0.0
    k.profile_file = ""             # a measured profile (bench.device_profile --out=FILE): the
    #                                 MFU of each phase, the decode, reward and regroup times
    #                                 (results/device_profile_*.json), instead of cost.mfu
    k.mbu = 0.7                     # ASSUMPTION: achieved/peak HBM bandwidth when streaming
    #                                 the weights (floor of a small-batch step)
    k.nvlink_one_way = 0.5          # NVLink datasheet figures count both directions; one
    #                                 direction gets half (NVIDIA NVLink 4: 450 GB/s each way);
    #                                 the same share of a TPU's ICI (its datasheet figure is
    #                                 bidirectional too)
    k.collective_latency_s = 20e-6  # ASSUMPTION: fixed cost per intra-node collective (order
    #                                 of NCCL small-message latency on NVLink)
    # --- paper workload -------------------------------------------------------------------
    # The paper-scale model whose FLOPs time the profile: the model section of this config
    # (configs/<name>.py or a path), at image_pixels / vae_factor latent cells.
    k.profile_model = "qwen_image"
    k.image_pixels = 512            # paper: Qwen-Image at 512^2 (and 1280^2)
    k.vae_factor = 8                # Qwen-Image/SD3-style VAE downsamples by 8
    #                                 (configs/qwen_image.py: 1280 px -> 160 latent cells)
    k.cfg_passes = 2                # forwards per denoising step: Flow-GRPO's presets use CFG
    #                                 4.5 in rollouts and training (the paper) = cond+uncond;
    #                                 0 = follow the run's sampler.guidance
    k.lora_rank = 32                # configs/qwen_image.py (Flow-GRPO: LoRA r=32);
    #                                 -1 = follow the run's rl.lora_rank
    k.backward_factor_full = 2.0    # backward = 2x forward FLOPs with weight gradients
    #                                 (the 6N-per-token rule, Kaplan et al. 2020)
    k.backward_factor_lora = 1.0    # frozen base weights: only activation gradients (~1x fwd)
    k.param_bytes = 2               # bf16 weights (configs/qwen_image.py param_dtype)
    k.adapter_bytes = 4             # LoRA factors are float32 (spotlight_jax/rl/lora.py)
    k.act_bytes = 2                 # bf16 activations moved by SP collectives
    k.reward_s_per_image = 0.1      # ASSUMPTION: detector/OCR reward model on a GPU, per image
    k.network_gbit_s = 100.0        # ASSUMPTION: node-to-node bandwidth for the weight broadcast
    #                                 (a common cloud NIC tier; GPU fabrics such as EFA are faster)
    # --- SP regroup latencies -------------------------------------------------------------
    k.regroup_shrink_s = 7.6e-3     # MEASURED: bench.reconfig --stand_in (then bench.regroup),
    #                                 warm regroup after losing 2 of 8 devices, 50M params: 7.6 ms
    k.regroup_grow_measured_s = 0.644  # MEASURED: the same, rejoin (device-to-device copy,
    #                                    50M params, CPU): 644 ms; profile derives it from NVLink
    k.regroup_cold_s = 120.0        # ASSUMPTION: reload from storage + recompile takes
    #                                 "minutes" (paper abstract: minutes -> sub-second)
    # --- prices ---------------------------------------------------------------------------
    k.on_demand_per_hour = 3.90     # $/GPU-h, public H100 on-demand list prices ~$3.90
    k.spot_discount = 0.73          # paper: spot 69-77% cheaper; 0.73 ->
    #                                 $1.05/GPU-h, inside the public $0.8-2.5 spot range
    # 'config': the two prices above; 'datasheet': cost.device's list prices per chip-hour
    # (on-demand and spot, with their source: emulation.datasheets, the TPUs)
    k.price_source = "config"

    # compare mode's target validation reward: baseline's start + target_gain when > 0, else
    # its start + target_frac of baseline's own best gain; seeds: run the comparison once per
    # config seed (workdir/seed_<s>) and report every ratio's mean and spread ('()' = c.seed)
    c.compare = ml_collections.ConfigDict(dict(target_frac=0.8, target_gain=0.0, seeds=()))
    return c


def paper_scale(c, *, sp: int, attention: str, scan_blocks: bool):
    """The run settings the paper-scale configs share (qwen_image, sd35_medium, flux_dev): a
    latent model without the tiny model's pixel convs, bf16 with remat, 8 emulated devices all
    the trainer's as fsdp x ``sp`` (``attention`` over sp), the paper's 48 prompts x 24 seeds
    per iteration, LoRA r32, nft's 144 accumulated chunks and the sampler's shift 3."""
    m = c.model
    m.conv_stem = 0
    m.conv_head = False
    m.dtype = "bfloat16"
    m.param_dtype = "bfloat16"
    m.remat = True
    m.scan_blocks = scan_blocks
    c.num_cpu_devices = 8
    c.trainer_devices = 0
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.sp = sp
    c.attention = attention
    c.pretrain.batch_size = 8
    c.rl.prompts_per_iter = 48
    c.rl.group_size = 24
    c.rl.lora_rank = 32
    c.rl.lora_alpha = 64.0
    c.rl.nft.minibatches = 144   # nft: 8 images (x rl.nft.times rows) per accumulated chunk
    c.sampler.shift = 3.0
    return c
