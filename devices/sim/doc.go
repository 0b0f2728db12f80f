// Package sim simulates devices behind a fence point (package shim), alone
// (Host) or as an MQTT fleet (Fleet), for tests, demonstrations and the
// edgefence-devsim command.
//
// Every simulated device is a small thermostat (Thermostat): a setpoint, a
// mode ("off", "heat", "cool" or "auto"), a relay, the number of commands
// applied, and the token, seq and id of the last one. Its state lives in the
// same bbolt file as the shim's marks and is written in the same transaction
// as the mark (shim.TxApplier), so every accepted command takes effect
// exactly once, even across kill -9. That is device kind DeviceThermostat,
// the default and a shipped build's only kind; test and demo builds (-tags
// edgefence_unsafe) also have DeviceUnfenced, the same thermostat with no
// fence point, for showing what the fence prevents.
//
// Commands (Envelope.Kind):
//
//	set   body: CBOR map with any of "setpoint" (number, -50..150),
//	      "mode" (text) and "relay" (bool); at least one; anything else,
//	      or a wrong type, is Invalid, with a reason naming the field
//	ping  no body (or CBOR null); no change but the applied count
//	twin.set  body: a twin delta from the agent's reconciler, a CBOR map
//	      with any of "setpoint", "mode" and "relay" (values as for set);
//	      an unknown field is Invalid, with a reason naming it
//
// After every verdict a Host appends one JSON line (VerdictRecord) to its
// verdict log, with the device state after the decision, in one Write;
// ReadVerdictLog parses such a log.
//
// A Fleet serves a set of devices over one MQTT v5 client: commands arrive
// on <prefix>/dev/<id>/cmd, acks (CBOR fence.Ack, QoS 1, correlation data
// copied from the command) go to <prefix>/dev/<id>/ack or to the command's
// response topic, and the state (CBOR map, see State) goes to
// <prefix>/dev/<id>/state after every applied command.
//
// A FirmwareDevice is one device that also takes firmware jobs (the fw.*
// kinds of package fwjob, in the same fence point and transaction as its
// thermostat): it boots through fwjob.Boot, the booted image deciding a
// trial's health check (HealthMarker; FirmwareImage builds test images),
// publishes its state report (FirmwareState: the thermostat's fields, "fw"
// and "firmware") retained, and asks its caller to restart it when a
// command reboots it (RebootRequested): edgefence-devsim --firmware runs
// each as a process that exits to reboot.
package sim
