// Package fwjob is the device's side of a firmware job (issue 15): the
// state machine a Linux-class device runs behind its fence point (package
// shim), A/B image slots, a boot counter and an anti-rollback security
// version, safe against power loss at every point.
//
// Every step is a fenced command (Envelope.Kind), its body a CBOR map with
// text keys (BeginBody, ChunkBody, JobBody):
//
//	fw.begin    {job, image (SHA-256, 32 bytes), size, version, chunk,
//	             manifest (optional: the operator's signed image manifest)}
//	fw.chunk    {job, off, data}   off must be the bytes received
//	fw.install  {job}              verify the slot → installed
//	fw.activate {job}              arm a trial boot of the new slot → rebooting
//	fw.commit   {job}              only in confirming
//	fw.cancel   {job}              abort; rebooting/confirming roll back
//
// The job's states (State):
//
//	idle ─begin→ downloading ─chunk…→ downloaded ─install→ installing ─(device)→ installed
//	  ─activate→ rebooting ─(Boot: trial boot, health check)→ confirming ─commit→ committed
//	downloading…installed ─cancel→ failed; rebooting, confirming ─cancel→ rolled_back
//	the last chunk's hash or the install's check fails → failed (reason)
//	health check fails, no answer within the window, tries spent,
//	trial slot does not verify → rolled_back (reason), by the device itself
//
// A step illegal in the state is refused invalid, the reason naming the
// state ("fw.install of job j1 in state downloading"); a step of another
// job while one is in progress is refused naming it ("job j1 in progress
// (state downloading)"); fw.begin of an image whose version is below the
// running security version is refused (anti-rollback, as SUIT's sequence
// number; equal is allowed, fw.commit raises it to the image's); a chunk
// not at the bytes received is refused "expected offset N", so a holder —
// the same or a new one after a failover — resumes from the device's
// reported bytes. State checks run in ApplyTx, after the admit rule, so a
// deposed holder's step is stale, never applied, whatever it is.
//
// Image manifests: a device given the operator's root (Config.Manifests,
// a fence/auth Trust or RootKey) installs only images the operator
// released. Its fw.begin must carry the image's manifest, a COSE_Sign1 by
// the root (auth.Root.Manifest: SHA-256, size, security version), and the
// manifest must name exactly the begin's image, size and version; anything
// else — no manifest, one signed by any other key (a gateway's too, even
// one the root certified for this device), altered, of another content
// type or image — is refused invalid with ErrManifest ("manifest: …"),
// checked with the body before the admit rule, so nothing moves. Without
// Config.Manifests the field is only bounded (auth.MaxManifestSize).
//
// Durability (I3): Device is a shim.TxApplier. The job record and the boot
// state (one CBOR value, bucket "fwjob", key "state", in the shim's own
// file DBPath) are written in the transaction that moves the mark, so a
// step's record, its effect on the boot state and the mark commit together
// with one fsync, or not at all. What lives outside bbolt is written and
// fsynced before that commit: fw.begin empties the inactive slot (the one
// not active; never the running one: a begin waits for a pending reboot),
// fw.chunk writes its data at off. A crash between the slot write and the
// commit leaves the record's bytes where they were, and the same chunk is
// simply sent again (the mark did not move either, so it is not a
// duplicate). The running SHA-256 over the bytes received is part of the
// record, so the last chunk is checked without reading the slot back.
//
// fw.install is accepted into installing; the device then verifies the
// slot against the image hash on its own (Device.Settle, which Handle calls
// after the command; a crash before it leaves installing, which Boot
// settles): installed, or failed with the reason.
//
// Boot is the boot loader, run when the device (re)starts, before its
// fence point opens. It boots the active slot, or, when fw.activate armed a
// trial, verifies the trial slot's hash (a slot that does not verify is
// never booted), spends one of its tries (durably, before the new image
// runs: Config.BootTries), runs the caller's health check within its window
// and records the verdict: confirming, or roll back to the active slot.
// fw.commit makes the trial slot active and the old one the spare. So every
// boot runs either the active image, verified when it was installed, or a
// trial image verified just now, and a new image that never confirms is
// abandoned after its tries whatever happens to the power.
//
// Status is the firmware state; Status.Report is the "fw" field of the
// device's state report: {job, state, bytes, size, slot (the running one),
// version (the running security version), reason, token (of the last
// step), image (hex SHA-256 of the running slot's image as the boot loader
// holds it: Status.RunningImage; "" between a fw.cancel of the running
// trial and the reboot it asks for)}.
//
// A device that does more than take firmware (a thermostat, say) keeps
// its application behind the same fence point: Config.Other takes every
// command whose kind is not fw.*, in the same transaction as the mark.
package fwjob
