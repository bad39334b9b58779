"""Evaluate a checkpoint: top-1 and top-5 accuracy on the evaluation data of a config.

    python eval.py --config_path cpu_smoke --data_path synthetic --checkpoint_file_path outputs/cpu_smoke/ckpt_0/resnet-2_4.ckpt

The checkpoint may be one written by train.py (network and optimizer state: only the network's
parameters are read) or a network-only checkpoint. Prints one line ``result: {...}`` (JSON) and,
with ``--result_json``, writes it to a file.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from src import runtime  # noqa: E402  (imports no MindSpore: the CPU ISA variable is set first)


def _add_arguments(parser):
    parser.add_argument("--checkpoint_file_path", "--checkpoint_path", dest="checkpoint_file_path", required=True,
                        help="checkpoint to evaluate (--checkpoint_path is a deprecated alias)")
    parser.add_argument("--result_json", default="", help="also write the result to this JSON file")


def evaluate(args, config):
    from mindspore import nn
    from mindspore.train import Model

    from src.dataset import create_dataset
    from src.resnet import build_network

    runtime.setup_context(config)
    network = build_network(config["net"], config["class_num"], config["net_options"])
    runtime.load_checkpoint(args.checkpoint_file_path, [network])
    network.set_train(False)
    data = create_dataset(config, training=False)
    if data is None:
        raise runtime.UsageError("no evaluation data: give --eval_dataset_path (or a DATA_PATH holding val/)")
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=config["label_smooth_factor"])
    metrics = {"top_1_accuracy": nn.Top1CategoricalAccuracy(), "top_5_accuracy": nn.Top5CategoricalAccuracy(),
               "loss": nn.Loss()}
    model = Model(network, loss_fn=loss, metrics=metrics)
    result = {k: float(v) for k, v in model.eval(data, dataset_sink_mode=False).items()}
    result.update(checkpoint=os.path.abspath(args.checkpoint_file_path), config=config["config_path"])
    print("result: " + json.dumps(result), flush=True)
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return result


def main(argv=None):
    from src.config import EVAL_KEYS
    args, config = runtime.parse(__doc__.splitlines()[0], _add_arguments, argv, config_keys=EVAL_KEYS)
    return runtime.main_guard(lambda: evaluate(args, config), "eval.py")


if __name__ == "__main__":
    main()
