// Package jobs is the fleet side of firmware jobs (issue 15): job
// documents and their rollouts in etcd, the per-device executions that only
// a device's lease holder writes, and the runner that drives a held
// device's firmware state machine (devices/fwjob) through the fenced path.
//
// Keys, under the agent's etcd prefix P:
//
//	P/jobs/<job>                 the job document (Job, JSON), written once by `edgefence job create`
//	P/rollouts/<job>             the rollout's shared state (Rollout, JSON): status (active, paused,
//	                             canceled, aborted, completed), counts per execution status, the
//	                             recent starts (rate) — every gateway decides against it in a txn
//	P/devices/<id>/jobs/<job>    the device's execution (Execution, JSON): AWS IoT Jobs' statuses,
//	                             step, bytes, reason, the writer's gateway and token
//	P/executions/<job>/<id>      the same execution, for listing a job's executions by prefix;
//	                             always written in the same transaction as the device's key
//
// An execution is written only in a transaction that checks the writer's
// lock key still exists with CreateRevision == its token (I5, as twin
// reported writes) and that the execution is at the revision the writer
// read, so a deposed holder writes nothing and two writers cannot lose each
// other's updates. A new holder after a failover reads the execution and the
// device's own firmware report and resumes from the last durable step under
// its own token.
package jobs
