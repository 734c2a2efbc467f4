"""The Lambda functions, one module (or package) each with one ``handler(event, context)``:
``api``, ``dlq``, ``sweeper``, ``webhook_dispatcher``, ``sagemaker_bridge``,
``sagemaker_completion``, ``backlog_metric``, ``ecs_teardown``. ``lambdas/<name>/app.py`` is one
import of that handler."""
