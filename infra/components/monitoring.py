"""Dashboard and alarms."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import job_metrics as jm
from infra.components.model_scopes import ModelScopes

#: Job metrics (EMF, namespace ``asyncinfer``, dimension ``Model`` only) that the worker and the
#: SageMaker completion Lambda publish: one definition, :mod:`asyncinfer.core.job_metrics`.
JOB_METRICS = tuple(jm.UNITS)


def job_metric(name: str, model: str, statistic: str = "Sum") -> cloudwatch.Metric:
    """A job metric of ``model`` over 5 minutes, as :mod:`asyncinfer.core.job_metrics` defines it
    (``KeyError`` for a name it does not define)."""
    jm.UNITS[name]
    return cloudwatch.Metric(
        namespace=jm.NAMESPACE,
        metric_name=name,
        dimensions_map={jm.DIMENSION: model},
        statistic=statistic,
        period=Duration.minutes(5),
    )


class Monitoring(Construct):
    """A CloudWatch dashboard and, per model, three alarms: DLQ not empty, oldest message older
    than ``oldest_message_seconds``, failure rate above ``failure_rate_percent`` (failed /
    (succeeded + failed) over 15 minutes). Alarm actions go to ``alarm_topic`` when given.

    Args:
        queues / dlqs: model id -> queue.
        workers_metric: model id -> metric of running workers (tasks or instances).
        alarm_topic: optional SNS topic for alarm and OK notifications.
        oldest_message_seconds: age threshold, seconds.
        failure_rate_percent: threshold, percent.
        dashboard: create the dashboard (CloudWatch bills a dashboard per month).
        scopes: where each model's alarms go (:class:`ModelScopes`; default: here).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        queues: Mapping[str, sqs.IQueue],
        dlqs: Mapping[str, sqs.IQueue],
        workers_metric: Mapping[str, cloudwatch.IMetric],
        alarm_topic: sns.ITopic | None,
        oldest_message_seconds: int,
        failure_rate_percent: float,
        dashboard: bool = True,
        scopes: ModelScopes | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.alarms: list[cloudwatch.Alarm] = []
        one_min = Duration.minutes(1)
        self.dashboard = (
            cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
            if dashboard
            else None
        )
        for model, queue in queues.items():
            sc = scopes.of(self, model) if scopes else self
            dlq = dlqs[model]
            visible = queue.metric_approximate_number_of_messages_visible(
                period=one_min, statistic="Maximum"
            )
            in_flight = queue.metric_approximate_number_of_messages_not_visible(
                period=one_min, statistic="Maximum"
            )
            oldest = queue.metric_approximate_age_of_oldest_message(
                period=one_min, statistic="Maximum"
            )
            dlq_depth = dlq.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"
            )
            failed = job_metric(jm.JOBS_FAILED, model)
            succeeded = job_metric(jm.JOBS_SUCCEEDED, model)
            if self.dashboard is not None:
                self._widgets(
                    model,
                    visible=visible,
                    in_flight=in_flight,
                    oldest=oldest,
                    workers=workers_metric[model],
                    outcomes=[succeeded, failed],
                    dlq_depth=dlq_depth,
                )
            self.alarms.append(
                dlq_depth.create_alarm(
                    sc,
                    f"{model}-dlq-not-empty",
                    alarm_description=f"{model}: messages in the dead-letter queue",
                    threshold=0,
                    comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    evaluation_periods=1,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )
            self.alarms.append(
                oldest.create_alarm(
                    sc,
                    f"{model}-oldest-message",
                    alarm_description=f"{model}: a job waited over {oldest_message_seconds} s",
                    threshold=oldest_message_seconds,
                    comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    evaluation_periods=3,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )
            rate = cloudwatch.MathExpression(
                expression="IF(s + f > 0, 100 * f / (s + f), 0)",
                using_metrics={"s": succeeded, "f": failed},
                period=Duration.minutes(5),
                label=f"{model} failure rate (%)",
            )
            self.alarms.append(
                rate.create_alarm(
                    sc,
                    f"{model}-failure-rate",
                    alarm_description=f"{model}: over {failure_rate_percent}% of jobs failed",
                    threshold=failure_rate_percent,
                    comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    evaluation_periods=3,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )
        if alarm_topic is not None:
            action = cw_actions.SnsAction(alarm_topic)
            for alarm in self.alarms:
                alarm.add_alarm_action(action)
                alarm.add_ok_action(action)

    def _widgets(
        self,
        model: str,
        *,
        visible: cloudwatch.IMetric,
        in_flight: cloudwatch.IMetric,
        oldest: cloudwatch.IMetric,
        workers: cloudwatch.IMetric,
        outcomes: list[cloudwatch.IMetric],
        dlq_depth: cloudwatch.IMetric,
    ) -> None:
        """The dashboard row of ``model``; the job widgets use :func:`job_metric`, the same
        definitions as the alarms."""
        assert self.dashboard is not None
        self.dashboard.add_widgets(
            cloudwatch.TextWidget(markdown=f"## {model}", width=24, height=1),
            cloudwatch.GraphWidget(
                title=f"{model}: backlog and in flight", left=[visible, in_flight], width=8
            ),
            cloudwatch.GraphWidget(
                title=f"{model}: age of oldest message (s)", left=[oldest], width=8
            ),
            cloudwatch.GraphWidget(title=f"{model}: running workers", left=[workers], width=8),
            cloudwatch.GraphWidget(
                title=f"{model}: queue wait (s)",
                left=[job_metric(jm.QUEUE_SECONDS, model, p) for p in ("p50", "p90", "p99")],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title=f"{model}: run time (s)",
                left=[job_metric(jm.RUN_SECONDS, model, p) for p in ("p50", "p90", "p99")],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title=f"{model}: outcomes and DLQ depth", left=outcomes, right=[dlq_depth], width=8
            ),
        )
