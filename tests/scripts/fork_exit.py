"""A child made by os.fork() records regions for 3 s and ends with os._exit (no atexit, no
finalize); it prints how many it recorded and when the last began (ns, time.time_ns).

    python fork_exit.py PREFIX
"""
import os
import sys
import time

from dftrace_dynamo import dftracer, region

dftracer.initialize_log(sys.argv[1])
with region("parent"):
    pass
pid = os.fork()
if pid == 0:
    n, end = 0, time.time() + 3
    while time.time() < end:
        last = time.time_ns()
        with region("child", n=n):
            time.sleep(0.001)
        n += 1
    print(n, last, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
