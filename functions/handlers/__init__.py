"""What each target runs, all over :class:`functions.runtime.FunctionRuntime`: the AWS Lambda handler
(``aws_lambda.handler``), the OpenFaaS server (``openfaas.main``), the Open Inference Protocol routes both
serve on the master (``routes``) and how an instance starts (``cold_start``); the local platform runs
``python -m functions.local_instance``. The deployers ship these modules in every function package; the
files in ``templates/`` only point a target at them."""

__all__ = ["aws_lambda", "cold_start", "instance", "openfaas", "routes"]
