"""A Modbus slave for edgefence's tests: pymodbus 3.0.0 (Debian's
python3-pymodbus), run by /usr/bin/python3 with one JSON argument:

  {"rtu": PATH, "baud": 19200, "parity": "E", "stop_bits": 1}  or  {"tcp": PORT}
  "units": [7, 9]                        the unit ids it answers (others: silence)
  "hr": N, "ir": N, "co": N, "di": N     block sizes, each from address 0

On a pty the parity is ignored (see serve).

Initial values: holding and input register i of unit u is u*256 + i%256;
discrete input i is (u+i)%2; coils are 0. It prints "ready PORT" on stdout
once it serves (PORT is the bound TCP port, 0 on a serial line), then
serves until killed.
"""
import asyncio
import json
import logging
import os
import sys

from pymodbus.datastore import (ModbusSequentialDataBlock, ModbusServerContext,
                                ModbusSlaveContext)
from pymodbus.server.async_io import ModbusSerialServer, ModbusTcpServer
from pymodbus.transaction import ModbusRtuFramer, ModbusSocketFramer


def slave(unit, spec):
    regs = [(unit * 256 + i % 256) & 0xFFFF for i in range(spec.get("hr", 100))]
    inputs = [(unit * 256 + i % 256) & 0xFFFF for i in range(spec.get("ir", 100))]
    return ModbusSlaveContext(
        hr=ModbusSequentialDataBlock(0, regs),
        ir=ModbusSequentialDataBlock(0, inputs),
        co=ModbusSequentialDataBlock(0, [0] * spec.get("co", 100)),
        di=ModbusSequentialDataBlock(0, [(unit + i) % 2 for i in range(spec.get("di", 100))]),
        zero_mode=True,  # request address 0 is block address 0
    )


async def serve(spec):
    context = ModbusServerContext(
        slaves={u: slave(u, spec) for u in spec["units"]}, single=False)
    if "rtu" in spec:
        parity = spec.get("parity", "N")
        if parity != "N" and os.path.realpath(spec["rtu"]).startswith("/dev/pts/"):
            # A pty has no parity bit: Linux clears PARENB on it, and glibc's
            # tcsetattr, seeing PARENB not stick, fails with EINVAL, so
            # pyserial cannot open a pty with parity. Nothing is lost: a pty
            # carries bytes, not bits.
            print("pty %s: parity %s not settable, serving with N" % (spec["rtu"], parity),
                  file=sys.stderr, flush=True)
            parity = "N"
        server = ModbusSerialServer(
            context, framer=ModbusRtuFramer, port=spec["rtu"],
            baudrate=spec.get("baud", 19200), parity=parity,
            stopbits=spec.get("stop_bits", 1), bytesize=8, timeout=0.05,
            ignore_missing_slaves=True)
        await server.start()
        print("ready 0", flush=True)
        await server.serve_forever()
        return
    server = ModbusTcpServer(
        context, framer=ModbusSocketFramer, address=("127.0.0.1", spec["tcp"]),
        ignore_missing_slaves=True,
        allow_reuse_address=True)  # a restart binds the same port at once
    task = asyncio.create_task(server.serve_forever())
    await asyncio.wait([task, server.serving], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # serve_forever failed (e.g. the port is taken): raise it
        sys.exit("server stopped before serving")
    print("ready %d" % server.server.sockets[0].getsockname()[1], flush=True)
    await task


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    asyncio.run(serve(json.loads(sys.argv[1])))
