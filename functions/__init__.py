"""Code that runs inside every function: master and worker roles, handlers for each target, the tensor
codec, the Open Inference Protocol codec and error->status table every HTTP front-end shares, transports
and invokers. Depends on numpy and onnxruntime (plus redis / boto3 when that
transport or target is used); never on the partitioner or torch."""

__all__ = [
    "codec",
    "config",
    "errors",
    "event",
    "executor",
    "handlers",
    "http_errors",
    "inference_protocol",
    "invoker",
    "master",
    "plan",
    "runtime",
    "session",
    "transport",
    "worker",
]
