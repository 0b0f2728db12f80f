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
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
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
	Sign   *bareSign // nil: plain envelopes and acks
}

// bareResult is the child's answer.
type bareResult struct {
	Wall     time.Duration // first publish → last accepted ack
	CPU      time.Duration // the child's user+sys over Wall
	Accepted int
	Signed   bool // envelopes signed, acks verified (bareSign)
	Refused  int  // acks that did not verify or answer the envelope sent (signed)
	Err      string
}

// bareSign is how the bare client signs and verifies, as the agent does
// with --sign: the gateway's key (KeyFile, KeyID) signs each envelope as
// it is published (COSE_Sign1 ES256, fence/auth), and an ack counts only
// if it verifies with its device's certificate (DeviceKeys/<id>.cert,
// chained to the root) and answers the envelope sent to that device.
type bareSign struct {
	KeyFile, KeyID   string
	RootPub, RootKID string
	DeviceKeys       string
}

// bareAuth is a bareSign loaded in the child, before anything is timed;
// nil: plain envelopes and acks.
type bareAuth struct {
	signer  *auth.Signer
	trust   *auth.Trust
	sent    map[string]*fence.Envelope // by device: what its ack must answer
	refused atomic.Int64
}

// load reads the keys and the devices' certificates and decodes envs (to
// devs, in order); nil for a nil s.
func (s *bareSign) load(devs []string, envs [][]byte) (*bareAuth, error) {
	if s == nil {
		return nil, nil
	}
	key, err := auth.ReadKey(s.KeyFile)
	if err != nil {
		return nil, err
	}
	a := &bareAuth{sent: make(map[string]*fence.Envelope, len(devs))}
	if a.signer, err = auth.NewSigner([]byte(s.KeyID), key); err != nil {
		return nil, err
	}
	root, err := auth.ReadPublic(s.RootPub)
	if err != nil {
		return nil, err
	}
	if a.trust, err = auth.NewTrust([]byte(s.RootKID), root, nil); err != nil {
		return nil, err
	}
	for i, d := range devs {
		if _, err := a.trust.AddCertificateFile(filepath.Join(s.DeviceKeys, d+".cert")); err != nil {
			return nil, fmt.Errorf("device %s: %w", d, err)
		}
		if a.sent[d], err = fence.UnmarshalEnvelope(envs[i]); err != nil {
			return nil, fmt.Errorf("device %s: %w", d, err)
		}
	}
	return a, nil
}

// payload is what is published to dev: plain as given, or its envelope
// signed now.
func (a *bareAuth) payload(dev string, plain []byte) ([]byte, error) {
	if a == nil {
		return plain, nil
	}
	return a.signer.Sign(a.sent[dev])
}

// ack returns the ack in raw: decoded (plain), or verified with its
// device's certificate and bound to the envelope sent to that device.
func (a *bareAuth) ack(raw []byte) (*fence.Ack, error) {
	if a == nil {
		return fence.UnmarshalAck(raw)
	}
	v, err := auth.VerifyAck(raw, a.trust)
	if err == nil {
		if env, ok := a.sent[v.Ack.Device]; !ok {
			err = fmt.Errorf("ack of %s: no command sent to it", v.Ack.Device)
		} else {
			err = auth.BoundTo(v.Ack, env)
		}
	}
	if err != nil {
		a.refused.Add(1)
		return nil, err
	}
	return v.Ack, nil
}

// runBareChild runs the job on stdin and writes its result to stdout.
func runBareChild(ctx context.Context, stdin io.Reader, stdout io.Writer) int {
	var job bareJob
	var res bareResult
	if err := json.NewDecoder(stdin).Decode(&job); err != nil {
		res.Err = "job: " + err.Error()
	} else if sa, err := job.Sign.load(job.Devs, job.Envs); err != nil {
		res.Err = "sign: " + err.Error()
	} else {
		if res.Wall, res.CPU, res.Accepted, err = bareFanout(ctx, job.Broker, job.Topics, job.Devs, job.Envs, sa); err != nil {
			res.Err = err.Error()
		}
		if sa != nil {
			res.Signed, res.Refused = true, int(sa.refused.Load())
		}
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil || res.Err != "" {
		return 1
	}
	return 0
}

// bareFanoutProc runs the baseline in a child process: to each device the
// next seq under the token the agent's last fan-out used, so that the
// device accepts and fsyncs it; signed and verified with sign (nil: plain).
func bareFanoutProc(ctx context.Context, brokerURL string, topics mqtt.Topics, devs []string, last map[string]agent.SendResult, sign *bareSign) (bareResult, error) {
	job := bareJob{Broker: brokerURL, Topics: topics, Devs: devs, Envs: make([][]byte, len(devs)), Sign: sign}
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
