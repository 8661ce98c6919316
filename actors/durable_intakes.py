"""Starting the JetStream intakes a worker's settings ask for: durable jobs (`--durable`) and a
pipeline (`--pipeline-stream`). Kept apart from worker.py so the worker only wires them in."""

from poolwire.actors.durable import DurableJobs, IntakeLimits, JetStreamIntake, through_elections
from poolwire.actors.pipeline import PipelineIntake, PipelineSpec
from poolwire.actors.task_policy import TaskPolicy
from poolwire.schemas.tasks import Task, parse_task
from poolwire.settings import WorkerSettings


def pipeline_spec(settings: WorkerSettings, policy: TaskPolicy) -> PipelineSpec:
    s = settings
    missing = [f"--pipeline-{name}" for name, value in
               (("input", s.pipeline_input), ("output", s.pipeline_output)) if not value]
    if missing:
        raise ValueError(f"--pipeline-stream {s.pipeline_stream} needs {' and '.join(missing)} "
                         f"(e.g. --pipeline-input docs.in --pipeline-output docs.embedded)")
    if s.pipeline_input == s.pipeline_output:
        raise ValueError(f"--pipeline-output {s.pipeline_output!r} equals --pipeline-input: "
                         f"results would be consumed as documents; choose another output")
    task = s.pipeline_task or policy.configured.value
    if parse_task(task) is None or parse_task(task) not in policy.supported:
        raise ValueError(f"--pipeline-task {task!r} is not a task this model supports; "
                         f"supported tasks: {', '.join(t.value for t in policy.supported)}")
    return PipelineSpec(stream=s.pipeline_stream, input=s.pipeline_input.rstrip(".>"),
                        output=s.pipeline_output.rstrip(".>"), task=task,
                        text_field=s.pipeline_text_field, id_field=s.pipeline_id_field,
                        image_field=s.pipeline_image_field,
                        # With chunked processing an embed pipeline keeps whole documents
                        # (up to --max-embed-len) instead of cutting them to the model's maximum.
                        truncate=s.pipeline_truncate and not (s.chunked_processing
                                                              and parse_task(task) is Task.EMBED))


async def start_intakes(nc, settings: WorkerSettings, pipeline: PipelineSpec | None, validator,
                        replier, engine, supervisor, tracing=None) -> list[JetStreamIntake]:
    s = settings
    limits = IntakeLimits(max_deliveries=s.durable_max_deliveries, ack_wait_s=s.durable_ack_wait_s,
                          capacity=s.durable_capacity, batch=min(64, s.durable_capacity),
                          max_queued_tokens=s.max_queued_tokens,
                          poison_span_s=s.durable_poison_span_s)
    intakes: list[JetStreamIntake] = []
    common = dict(nc=nc, prefix=s.prefix, validator=validator, replier=replier, engine=engine,
                  limits=limits, replicas=s.durable_replicas, queue=s.queue)
    if tracing is not None:
        common["tracing"] = tracing
    if s.durable:
        intakes.append(DurableJobs(**common))
    if pipeline is not None:
        intakes.append(PipelineIntake(spec=pipeline, **common))
    for intake in intakes:
        try:
            await through_elections(intake.name, intake.bind)
        except RuntimeError:
            raise
        except Exception as exc:  # e.g. the server runs without JetStream
            raise RuntimeError(f"{intake.name}: could not bind to JetStream ({exc!r}); durable "
                               f"jobs and pipelines need a NATS server with JetStream "
                               f"(nats-server -js)") from exc
        supervisor.start_actor(intake)
        supervisor.start_loop(f"{intake.name}-pull", intake.pull_loop)
        supervisor.start_loop(f"{intake.name}-progress", intake.progress_loop)
    return intakes
