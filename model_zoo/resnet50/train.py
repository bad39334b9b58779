"""Train ResNet-50 v1.5 (or the CIFAR-style ResNet) with Momentum, K-FAC, THOR or SP-NGD.

    python train.py --config_path cpu_smoke --data_path synthetic
    python train.py --config_path resnet50_imagenet2012_thor_8p --data_path /data/imagenet --resume_ckpt CKPT

Everything comes from the YAML config (``--config_path``: a file, or a name in ``configs/``),
overridable per key on the command line (``--epoch_size 2``, ``--set kfac.damping=0.01``); see
README.md. The flags are those of MindSpore's models repository (``official/cv/ResNet``):
``--run_distribute``, ``--resume_ckpt``, ``--pre_trained``, ``--run_eval``, ``--eval_dataset_path``.

Launched by msrun (or a rank-table / mpirun launcher) the script initialises
``mindspore.communication``, trains data-parallel with gradients averaged over the ranks and reads
its shard of the training data; each rank writes checkpoints to ``OUTPUT_DIR/ckpt_RANK``.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from src import runtime  # noqa: E402  (imports no MindSpore: the CPU ISA variable is set first)


def _distribute_choice(text):
    """``--run_distribute``: the models repository passes True / False; auto is ours."""
    value = str(text).strip().lower()
    if value not in ("auto", "true", "false"):
        raise argparse.ArgumentTypeError(f"expected True, False or auto, got {text!r}")
    return value


def _add_arguments(parser):
    parser.add_argument("--resume_ckpt", "--resume", dest="resume_ckpt", default="", metavar="CKPT",
                        help="continue from a checkpoint written by this script (network, optimizer state "
                             "and step counter); training resumes after the epoch it was written "
                             "(--resume is a deprecated alias)")
    parser.add_argument("--pre_trained", default="", metavar="CKPT",
                        help="start from the network weights of this checkpoint (optimizer state and step "
                             "counter start fresh); parameters whose shape differs, such as a classifier "
                             "for another class_num, keep their initial values")
    parser.add_argument("--run_distribute", "--distribute", dest="run_distribute", type=_distribute_choice,
                        default="auto", metavar="{True,False,auto}",
                        help="data-parallel training; auto: when started by msrun / a rank table / mpirun "
                             "(--distribute is a deprecated alias)")


def _lean_model(network, loss, optimizer, metrics, manager, config):
    """``Model`` over ``mindspore_ngd.NGDTrainOneStepCell``: the training network MindSpore's own
    ``amp.build_train_network`` builds for ``Model`` (mixed precision, fixed loss scale), with its steps
    that capture nothing run in the lean graph; evaluation as ``Model``'s own."""
    from mindspore import nn
    from mindspore.train import Model, amp

    import mindspore_ngd as ngd
    if not isinstance(optimizer, ngd.NGDOptimizer):
        raise runtime.UsageError(f"lean_step: true needs a natural-gradient optimizer (kfac, thor, spngd), "
                                 f"got optimizer {config['optimizer']!r}")
    cell = amp.build_train_network(network, optimizer, loss, level=config["amp_level"], loss_scale_manager=manager)
    sens = manager.get_loss_scale() if manager is not None else None
    step = ngd.NGDTrainOneStepCell(cell.network, optimizer, sens=sens)
    evaluation = nn.WithEvalCell(network, loss, config["amp_level"] in ("O2", "O3"))
    return Model(step, eval_network=evaluation, eval_indexes=[0, 1, 2], metrics=metrics)


def _mc_fisher_model(network, loss, optimizer, metrics, config):
    """``Model`` over ``mindspore_ngd.MCFisherTrainStep``, for an optimizer section with ``fisher: mc`` (G from
    labels sampled from the network's own output; the gradients of the real loss train): float32, the
    optimizer's fixed loss scale, steps driven from Python; evaluation as ``Model``'s own."""
    from mindspore import nn
    from mindspore.train import Model

    import mindspore_ngd as ngd
    if config["amp_level"] != "O0":
        raise runtime.UsageError(f"fisher: mc trains in float32 (MCFisherTrainStep): set amp_level O0, "
                                 f"got {config['amp_level']!r}")
    if config["dataset_sink_mode"]:
        raise runtime.UsageError("fisher: mc runs two graphs per step from Python (MCFisherTrainStep): set "
                                 "dataset_sink_mode false")
    if config["lean_step"]:
        raise runtime.UsageError("fisher: mc and lean_step: true cannot be combined: MCFisherTrainStep drives "
                                 "the capture itself")
    step = ngd.MCFisherTrainStep(network, loss, optimizer)
    evaluation = nn.WithEvalCell(network, loss)
    return Model(step, eval_network=evaluation, eval_indexes=[0, 1, 2], metrics=metrics)


def _fit(model, config, train_data, eval_data, callbacks, initial_epoch):
    """Train, evaluating with ``Model.fit`` when there is evaluation data; the evaluation history.

    ``Model.fit`` evaluates after every ``valid_frequency`` epochs counted from the first; the
    config's ``eval_start_epoch`` is applied by listing the epochs (``valid_frequency`` takes a list).
    """
    from src.callbacks import EvalRecorder

    sink = config["dataset_sink_mode"]
    if eval_data is None:
        model.train(config["epoch_size"], train_data, callbacks=callbacks, dataset_sink_mode=sink,
                    initial_epoch=initial_epoch)
        return []
    epochs = [e for e in range(config["eval_start_epoch"], config["epoch_size"] + 1)
              if (e - config["eval_start_epoch"]) % config["eval_interval"] == 0]
    recorder = EvalRecorder()
    model.fit(config["epoch_size"], train_data, valid_dataset=eval_data, valid_frequency=epochs or [0],
              callbacks=callbacks + [recorder], dataset_sink_mode=sink, valid_dataset_sink_mode=False,
              initial_epoch=initial_epoch)
    return recorder.history


def train(args, config):
    from mindspore import nn
    from mindspore.train import CheckpointConfig, FixedLossScaleManager, LossMonitor, Model, ModelCheckpoint

    from src.callbacks import ThroughputMonitor
    from src.dataset import create_dataset
    from src.distributed import init_data_parallel, launched_distributed
    from src.optimizer import build_optimizer, schedule_parameter_names, statistics_note, validate_sections
    from src.resnet import build_network
    import mindspore_ngd as ngd

    runtime.setup_context(config)
    skipped = validate_sections(config)          # every section, before any launcher/communication setup
    distribute = args.run_distribute == "true" or (args.run_distribute == "auto" and launched_distributed())
    rank, group_size = init_data_parallel() if distribute else (0, 1)

    def log(message):
        if rank == 0:
            print(message, flush=True)

    if skipped:
        log(f"note: optimizer sections {skipped} not validated: this installation has no such optimizer")
    if group_size != config["device_num"]:
        log(f"note: the config's hyper-parameters are for device_num={config['device_num']} (global batch "
            f"{config['batch_size'] * config['device_num']}); this run has {group_size} device(s), global batch "
            f"{config['batch_size'] * group_size}")

    train_data = create_dataset(config, training=True, rank=rank, group_size=group_size)
    steps_per_epoch = train_data.get_dataset_size()
    network = build_network(config["net"], config["class_num"], config["net_options"])
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=config["label_smooth_factor"])
    optimizer, lr_values, _ = build_optimizer(config, network, steps_per_epoch, extra={"verbose": rank == 0})
    note = statistics_note(optimizer, config, group_size)
    if note:
        log(note)

    initial_epoch = 0
    if args.resume_ckpt and args.pre_trained:
        raise runtime.UsageError("give --resume_ckpt (continue a run) or --pre_trained (start from weights), not both")
    if args.pre_trained:
        kept = runtime.load_pretrained(args.pre_trained, network)
        log(f"network weights from {args.pre_trained}" + (f"; kept the initial values of {kept}" if kept else ""))
    if args.resume_ckpt:
        # loaded before Model.train builds the graph; docs/limitations.md ("Training modes") has the
        # loading rules for a graph already compiled
        params = runtime.load_checkpoint(args.resume_ckpt, [network, optimizer],
                                         skip=schedule_parameter_names(optimizer))
        initial_epoch = runtime.checkpoint_epoch(args.resume_ckpt, params)
        log(f"resumed from {args.resume_ckpt}: epoch {initial_epoch}, "
            f"step {int(optimizer.global_step.asnumpy().reshape(-1)[0])}")
        if initial_epoch >= config["epoch_size"]:
            raise runtime.UsageError(f"checkpoint {args.resume_ckpt!r} was written after epoch {initial_epoch}: "
                                     f"nothing left to train with epoch_size {config['epoch_size']}")

    loss_scale = config["loss_scale"]
    manager = FixedLossScaleManager(loss_scale, drop_overflow_update=False) if loss_scale != 1.0 else None
    metrics = {"top_1_accuracy": nn.Top1CategoricalAccuracy(), "top_5_accuracy": nn.Top5CategoricalAccuracy()}
    if isinstance(optimizer, ngd.NGDOptimizer) and optimizer.policy.fisher == "mc":
        model = _mc_fisher_model(network, loss, optimizer, metrics, config)
    elif config["lean_step"]:
        model = _lean_model(network, loss, optimizer, metrics, manager, config)
    else:
        model = Model(network, loss_fn=loss, optimizer=optimizer, metrics=metrics, loss_scale_manager=manager,
                      amp_level=config["amp_level"])

    output_dir = os.path.abspath(config["output_dir"])
    throughput = ThroughputMonitor(config["batch_size"], group_size,
                                   os.path.join(output_dir, f"throughput_rank{rank}.json"), printer=log)
    # a loss that explodes and stays finite stops the run with a reason (mindspore_ngd.DivergenceMonitor;
    # with dataset sinking it sees the last loss of each sink), and on Ascend / GPU the stop the step
    # records on the device is raised on the host (TrainingGuard)
    callbacks = ngd.train.with_divergence_stops([throughput,            # throughput is a TimeMonitor
                                                 LossMonitor(config["log_interval"])], optimizer)
    refresh = None
    if isinstance(optimizer, ngd.NGDOptimizer) and optimizer.policy.refresh.per_statistic:
        # SP-NGD: each epoch's share of statistics refreshed per step (1: every statistic every step)
        refresh = ngd.RefreshMonitor(optimizer, verbose=rank == 0)
        callbacks.append(refresh)
    if config["save_checkpoint_epochs"] > 0:
        ckpt_config = CheckpointConfig(save_checkpoint_steps=steps_per_epoch * config["save_checkpoint_epochs"],
                                       keep_checkpoint_max=config["keep_checkpoint_max"],
                                       append_info=["epoch_num", "step_num"])
        callbacks.append(ModelCheckpoint(prefix="resnet", directory=os.path.join(output_dir, f"ckpt_{rank}"),
                                         config=ckpt_config))
    eval_data = None
    if config["run_eval"] and config["eval_interval"] > 0 and rank == 0:
        eval_data = create_dataset(config, training=False)
        if eval_data is None:
            log("note: run_eval is set but there is no evaluation data (eval_dataset_path): not evaluating")

    log(f"training {config['net']} with {type(optimizer).__name__} on "
        f"{'synthetic data' if config['data_path'] == 'synthetic' else config['data_path']}: "
        f"{steps_per_epoch} steps/epoch x {config['batch_size']} images x {group_size} device(s), "
        f"epochs {initial_epoch + 1}-{config['epoch_size']}, lr {lr_values[0]:.6g} -> {lr_values[-1]:.6g}")
    history = _fit(model, config, train_data, eval_data, callbacks, initial_epoch)

    summary = {"rank": rank, "group_size": group_size, "optimizer": config["optimizer"],
               "config": config["config_path"], "steps_per_epoch": steps_per_epoch,
               "dataset_sink_mode": config["dataset_sink_mode"],
               "throughput": throughput.summary(), "eval": history}
    if refresh is not None:
        summary["refresh_ratio"] = [{"epoch": epoch, "steps": steps, "ratio": ratio}
                                    for epoch, steps, ratio in refresh.history]
    with open(os.path.join(output_dir, f"summary_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    log(f"done: {summary['throughput']['images_per_s']:.1f} images/s per device after the first epoch; "
        f"outputs in {output_dir}")
    return summary


def main(argv=None):
    args, config = runtime.parse(__doc__.splitlines()[0], _add_arguments, argv)
    return runtime.main_guard(lambda: train(args, config), "train.py")


if __name__ == "__main__":
    main()
