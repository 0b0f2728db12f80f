package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The fan-out's bare paho baseline runs in a process of its own (this
// binary again, with bareChildEnv set), so that its CPU — what the MQTT
// client alone spends on one QoS 1 request→reply a device on this machine
// — is measured apart from the broker and the rig, in the same run as the
// agent's, and the agent's CPU a device can be read against it.

// bareChildEnv makes main run one bare fan-out job (runBareChild).
const bareChildEnv = "EDGEFENCE_BENCH_BARE_FANOUT"

// bareJob is the bare fan-out a child runs: the envelopes, encoded.
type bareJob struct {
	Broker string
	Topics mqtt.Topics
	Devs   []string
	Envs   [][]byte
}

// bareResult is the child's answer.
type bareResult struct {
	Wall     time.Duration // first publish → last accepted ack
	CPU      time.Duration // the child's user+sys over Wall
	Accepted int
	Err      string
}

// runBareChild runs the job on stdin and writes its result to stdout.
func runBareChild(ctx context.Context, stdin io.Reader, stdout io.Writer) int {
	var job bareJob
	var res bareResult
	if err := json.NewDecoder(stdin).Decode(&job); err != nil {
		res.Err = "job: " + err.Error()
	} else {
		var err error
		if res.Wall, res.CPU, res.Accepted, err = bareFanout(ctx, job.Broker, job.Topics, job.Devs, job.Envs); err != nil {
			res.Err = err.Error()
		}
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil || res.Err != "" {
		return 1
	}
	return 0
}

// bareFanoutProc runs the baseline in a child process: to each device the
// next seq under the token the agent's last fan-out used, so that the
// device accepts and fsyncs it.
func bareFanoutProc(ctx context.Context, brokerURL string, topics mqtt.Topics, devs []string, last map[string]agent.SendResult) (bareResult, error) {
	job := bareJob{Broker: brokerURL, Topics: topics, Devs: devs, Envs: make([][]byte, len(devs))}
	for i, d := range devs {
		r := last[d]
		raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: d, Token: fence.Token(r.Token), Seq: r.Seq + 1,
			ID: fmt.Sprintf("bare-%d", i), Kind: "ping", IssuedAt: time.Now().UnixMilli(), Holder: "bench-bare"})
		if err != nil {
			return bareResult{}, err
		}
		job.Envs[i] = raw
	}
	in, err := json.Marshal(job)
	if err != nil {
		return bareResult{}, err
	}
	self, err := os.Executable()
	if err != nil {
		return bareResult{}, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), bareChildEnv+"=1")
	cmd.Stdin = bytes.NewReader(in)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	runErr := cmd.Run()
	var res bareResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return res, fmt.Errorf("bare paho process: %w (%v; stderr %q)", err, runErr, stderr.String())
	}
	if res.Err != "" {
		return res, errors.New("bare paho: " + res.Err)
	}
	return res, runErr
}

// selfCPU is this process's user+sys time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
