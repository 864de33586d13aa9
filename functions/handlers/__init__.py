"""Entry points for each target, all over :class:`functions.runtime.FunctionRuntime`:
``aws_lambda.handler(event, context)``, ``openfaas.handle(event, context)``; the local platform runs
``python -m functions.local_instance``."""

__all__: list[str] = []
