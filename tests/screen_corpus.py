"""The strict screen's corpus: bypass attempts it must refuse and honest candidates it must accept.

Each attack is a small candidate module. The line the screen must name ends in `#!`; `construct` is a piece of
the refusal's text. `live` attacks are also run, unscreened, in a plain Python (tests/test_screen.py): each sets
`ESCAPED`, and `proof` (an expression over the module's names, default `ESCAPED`) must hold there, so the corpus
shows each route really reaches what it claims in the torch and Python this suite runs on. Attacks that would
stop or change the test process (a debugger, reading the terminal, deleting a torch function) are static only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attack:
    id: str
    src: str
    construct: str
    live: bool = True
    proof: str = "ESCAPED"

    @property
    def line(self) -> int:
        marked = [i for i, ln in enumerate(self.src.splitlines(), 1) if ln.rstrip().endswith("#!")]
        assert len(marked) == 1, f"{self.id}: mark exactly one line with #!"
        return marked[0]


T = "import torch\n"
F = "import torch\nimport torch.nn.functional as F\n"
HEX = b"ESCAPED = __import__('sys')".hex()
ANNOT = "[globals().__setitem__('ESCAPED', True), int][1]"  # what typing evaluates, if asked to

ATTACKS = [
    # --- torch's module object carries modules as plain attributes (the routes) -------------------------
    Attack("torch.sys.modules", T + "ESCAPED = torch.sys.modules  #!\n", "torch.sys: is the module sys"),
    Attack("torch.os.system", T + "ESCAPED = torch.os.system  #!\n", "torch.os: is the module os"),
    Attack("torch.builtins.exec", T + "torch.builtins.exec('ESCAPED = 1')  #!\n", "torch.builtins: is the module"),
    Attack("torch.builtins.getattr", T + "ESCAPED = torch.builtins.getattr(torch, 'sys')  #!\n",
           "torch.builtins: is the module"),
    Attack("torch.builtins.open", T + "ESCAPED = torch.builtins.open  #!\n", "torch.builtins: is the module"),
    Attack("torch.importlib", T + "ESCAPED = torch.importlib.import_module('os')  #!\n",
           "torch.importlib: is the module importlib"),
    Attack("torch.ctypes.CDLL", T + "ESCAPED = torch.ctypes.CDLL(None)  #!\n", "torch.ctypes: is the module ctypes"),
    Attack("torch.inspect.currentframe", T + "ESCAPED = torch.inspect.currentframe()  #!\n",
           "torch.inspect: is the module inspect"),
    Attack("hex code through torch.builtins.exec", T + "ESCAPED = None\n"
           f"torch.builtins.exec(bytes.fromhex('{HEX}').decode())  #!\n", "torch.builtins: is the module",
           proof="ESCAPED.modules"),
    Attack("torch.platform, torch.threading", T + "ESCAPED = torch.threading.Thread  #!\n",
           "torch.threading: is the module threading"),
    Attack("a full-width name, normalised by Python", T + "ESCAPED = torch.\uff53\uff59\uff53  #!\n",
           "torch.sys: is the module sys"),
    Attack("a full-width getattr", T + "ESCAPED = \uff47\uff45\uff54\uff41\uff54\uff54\uff52(torch, 'sys')  #!\n",
           "getattr: not allowed"),
    # --- aliases of torch ------------------------------------------------------------------------------------------
    Attack("import torch as t", "import torch as t\nESCAPED = t.sys  #!\n", "torch.sys: is the module sys"),
    Attack("from torch import sys", "from torch import sys as s  #!\nESCAPED = s\n",
           "from torch import sys: is the module sys"),
    Attack("from torch import os", "from torch import os  #!\nESCAPED = os.system\n",
           "from torch import os: is the module os"),
    Attack("alias t = torch", T + "t = torch\nESCAPED = t.os  #!\n", "torch.os: is the module os"),
    Attack("alias of an alias", T + "a = torch\nb = a\nESCAPED = b.sys  #!\n", "torch.sys: is the module sys"),
    Attack("annotated alias", T + "import typing\nt: typing.Any = torch\nESCAPED = t.sys  #!\n", "torch.sys"),
    Attack("nn alias into its submodules", "from torch import nn\nESCAPED = nn.modules.module.weakref  #!\n",
           "torch.nn.modules: is the module torch.nn.modules"),
    Attack("F.np", F + "ESCAPED = F.np.ctypeslib  #!\n", "torch.nn.functional.np: is the module numpy"),
    Attack("F.importlib", F + "ESCAPED = F.importlib.import_module  #!\n", "is the module importlib"),
    Attack("F.torch.sys", F + "ESCAPED = F.torch.sys  #!\n", "torch.sys: is the module sys"),
    Attack("F.dataclasses.sys", F + "ESCAPED = F.dataclasses.sys  #!\n", "dataclasses.sys: is the module sys"),
    Attack("torch.functools.update_wrapper", T + "ESCAPED = torch.functools.update_wrapper  #!\n",
           "functools.update_wrapper: copies attributes named by strings"),
    Attack("a lazily imported torch submodule", T + "ESCAPED = torch.onnx  #!\n", "torch.onnx: not a public name"),
    Attack("torch._dynamo", T + "ESCAPED = torch._dynamo  #!\n", "attribute _dynamo: underscore"),
    Attack("torch.load", T + "ESCAPED = torch.load  #!\n", "torch.load: loads, saves"),
    Attack("torch.jit.script", T + "ESCAPED = torch.jit.script  #!\n", "torch.jit:"),
    Attack("torch.ops.aten", T + "ESCAPED = torch.ops.aten  #!\n", "torch.ops:"),
    Attack("torch.library", T + "ESCAPED = torch.library.Library  #!\n", "torch.library:"),
    Attack("torch.hub", T + "ESCAPED = torch.hub.load  #!\n", "torch.hub:"),
    Attack("torch.compile", T + "ESCAPED = torch.compile  #!\n", "torch.compile:"),
    Attack("TorchScript compiled from text", T + "ESCAPED = torch.CompilationUnit('def f(x):\\n    return x\\n')  #!\n",
           "torch.CompilationUnit: a C++ binding of TorchScript's runtime", proof="ESCAPED.f"),
    Attack("TorchScript IR loaded from bytes", T + "ESCAPED = torch.import_ir_module_from_buffer  #!\n",
           "a C++ binding of TorchScript's runtime"),
    Attack("torch's zip file writer", T + "ESCAPED = torch.PyTorchFileWriter  #!\n", "a C++ binding"),
    Attack("a function that returns a module", T + "ESCAPED = torch.get_device_module('cpu').torch  #!\n",
           "torch.get_device_module: returns a module"),
    Attack("torch.serialization", T + "ESCAPED = torch.serialization.pickle  #!\n",
           "torch.serialization: is the module torch.serialization"),
    Attack("torch.overrides", T + "ESCAPED = torch.overrides.TorchFunctionMode  #!\n", "torch.overrides:"),
    Attack("torch.testing", T + "ESCAPED = torch.testing.assert_close  #!\n", "torch.testing:"),
    Attack("torch.cuda", T + "ESCAPED = torch.cuda.is_available  #!\n", "torch.cuda: is the module"),
    Attack("torch.autograd.graph", T + "ESCAPED = torch.autograd.graph.saved_tensors_hooks  #!\n",
           "torch.autograd.graph: is the module"),
    Attack("torch.distributions.kl", T + "ESCAPED = torch.distributions.kl.warnings  #!\n",
           "torch.distributions.kl: is the module"),
    Attack("set_default_dtype", T + "torch.set_default_dtype(torch.get_default_dtype())  #!\nESCAPED = True\n",
           "torch.set_default_dtype: changes process-wide state"),
    Attack("use_deterministic_algorithms",
           T + "torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())  #!\nESCAPED = 1\n",
           "changes process-wide state"),
    Attack("register_kl", T + "ESCAPED = torch.distributions.register_kl  #!\n", "changes process-wide state"),
    Attack("frombuffer scratch", T + "ESCAPED = torch.frombuffer(bytearray(16), dtype=torch.uint8)  #!\n",
           "torch.frombuffer: a tensor over Python memory", proof="ESCAPED.numel() == 16"),
    Attack("from_file", T + "ESCAPED = torch.from_file  #!\n", "torch.from_file:"),
    Attack("UntypedStorage.from_file", T + "ESCAPED = torch.UntypedStorage.from_file  #!\n",
           "attribute .from_file:"),
    Attack("a tensor's numpy ctypes", T + "ESCAPED = torch.zeros(2).numpy().ctypes.data  #!\n",
           "attribute .numpy:"),
    # --- the other allowed modules' module attributes --------------------------------------------------------------
    Attack("typing.sys", "import typing\nESCAPED = typing.sys.modules  #!\n", "typing.sys: is the module sys"),
    Attack("typing.types", "import typing\nESCAPED = typing.types.FunctionType  #!\n", "typing.types: is the module"),
    Attack("dataclasses.sys", "import dataclasses\nESCAPED = dataclasses.sys  #!\n", "dataclasses.sys: is the module"),
    Attack("dataclasses.inspect", "import dataclasses\nESCAPED = dataclasses.inspect.currentframe  #!\n",
           "dataclasses.inspect: is the module inspect"),
    Attack("dataclasses.builtins", "import dataclasses\nESCAPED = dataclasses.builtins.exec  #!\n",
           "dataclasses.builtins: is the module builtins"),
    Attack("from dataclasses import sys", "from dataclasses import sys  #!\nESCAPED = sys\n",
           "from dataclasses import sys: is the module sys"),
    Attack("enum.bltns", "import enum\nESCAPED = enum.bltns.exec  #!\n", "enum.bltns: is the module builtins"),
    Attack("typing_extensions.inspect", "import typing_extensions\nESCAPED = typing_extensions.inspect  #!\n",
           "typing_extensions.inspect: is the module inspect"),
    Attack("copy.dispatch_table", "import copy\nESCAPED = copy.dispatch_table  #!\n", "copy.dispatch_table: a mutable"),
    Attack("typing.EXCLUDED_ATTRIBUTES", "import typing\nESCAPED = typing.EXCLUDED_ATTRIBUTES  #!\n", "a mutable"),
    # --- the harness's scoring helper ------------------------------------------------------------------------------
    Attack("rollout.paired", "from methods.common.rollout import paired  #!\nESCAPED = paired\n",
           "from methods.common.rollout import paired: is the module methods.common.paired"),
    Attack("rollout's package", "import methods.common.rollout\nESCAPED = methods.common.paired  #!\n",
           "only the way to methods.common.rollout is allowed"),
    Attack("rollout's package root", "import methods.common.rollout\nESCAPED = methods.grpo.sampler  #!\n",
           "only the way to methods.common.rollout"),
    Attack("from methods.common import paired", "from methods.common import paired  #!\nESCAPED = paired\n",
           "only the way to methods.common.rollout"),
    Attack("rollout.torch.sys", "import methods.common.rollout as r\nESCAPED = r.torch.sys  #!\n",
           "torch.sys: is the module sys"),
    Attack("rollout.F.np", "from methods.common.rollout import F\nESCAPED = F.np  #!\n",
           "torch.nn.functional.np: is the module numpy"),
    Attack("import methods", "import methods  #!\nESCAPED = methods\n", "import methods: not in the allowlist"),
    # --- imports ---------------------------------------------------------------------------------------------------
    Attack("import sys", "import sys  #!\nESCAPED = sys\n", "import sys: not in the allowlist"),
    Attack("import importlib", "import importlib  #!\nESCAPED = importlib\n", "import importlib: not in"),
    Attack("from engine.run import runner", "from engine.run import runner  #!\nESCAPED = runner\n",
           "from engine.run import ...: not in the allowlist"),
    Attack("import torch.utils", "import torch.utils  #!\nESCAPED = torch.utils\n", "import torch.utils: not in"),
    Attack("relative import", "from . import x  #!\n", "a relative import", live=False),
    Attack("star import", "from torch import *  #!\n", "from torch import *", live=False),
    Attack("import in a class body", "class C:\n    import torch as t  #!\nESCAPED = C.t.sys\n",
           "an import in a class body"),
    # --- a module used as a value: it would escape the screen's tracking (and reach torch.cuda, torch.storage,
# whose names are everyday methods the rule for unknown objects leaves alone) -------------------------------------
    Attack("module in a list", T + "ESCAPED = [torch][0].cuda  #!\n", "torch: the module torch used as a value"),
    Attack("module as a default", T + "def f(m=torch):  #!\n    return m.cuda\nESCAPED = f()\n", "used as a value"),
    Attack("module through a lambda", T + "ESCAPED = (lambda m: m.cuda)(torch)  #!\n", "used as a value"),
    Attack("module returned", T + "def f():\n    return torch  #!\nESCAPED = f().cuda\n", "used as a value"),
    Attack("module in a conditional", T + "m = torch if True else None  #!\nESCAPED = m.cuda\n", "used as a value"),
    Attack("module iterated", T + "for m in (torch,):  #!\n    ESCAPED = m.cuda\n", "used as a value"),
    Attack("module in a dict", T + "ESCAPED = {'t': torch}['t'].cuda  #!\n", "used as a value"),
    Attack("module by walrus", T + "ESCAPED = (m := torch).cuda  #!\n", "used as a value"),
    Attack("module as a keyword", T + "ESCAPED = dict(m=torch)['m'].cuda  #!\n", "used as a value"),
    Attack("submodule as a value", T + "ESCAPED = [torch.nn][0].modules  #!\n",
           "torch.nn: the module torch.nn used as a value"),
    Attack("module in a class body", T + "class C:\n    t = torch  #!\nESCAPED = C.t.cuda\n", "used as a value"),
    Attack("module unpacked", T + "import math\na, b = torch, math  #!\nESCAPED = a.cuda\n", "used as a value"),
    Attack("module yielded", T + "def g():\n    yield torch  #!\nESCAPED = next(g()).cuda\n", "used as a value"),
    Attack("module to type()", T + "ESCAPED = type(torch)('m')  #!\n", "type: only type(x).__name__"),
    Attack("a parameter named like a module", T + "def f(torch):  #!\n    return torch.sys\n",
           "torch: bound to the module torch and here to something else", live=False),
    Attack("a loop variable named like a module", "import torch\nimport math\nfor torch in [math]:  #!\n"
           "    ESCAPED = torch.sys\n", "bound to the module torch and here to something else", live=False),
    Attack("two modules under one name", "import torch as m\nimport math as m  #!\nESCAPED = m\n",
           "bound to the module torch and here to the module math"),
    Attack("del a module name", T + "del torch  #!\nESCAPED = True\n", "bound to the module torch"),
    # --- reflective built-ins, by any route --------------------------------------------------------------------
    Attack("getattr", T + "ESCAPED = getattr(torch, 'sys')  #!\n", "getattr: not allowed"),
    Attack("getattr via partial", T + "import functools\nESCAPED = functools.partial(getattr, torch)('sys')  #!\n",
           "getattr: not allowed"),
    Attack("getattr via reduce", T + "import functools\n"
           "ESCAPED = functools.reduce(getattr, ['sys', 'modules'], torch)  #!\n", "getattr: not allowed"),
    Attack("getattr via map", T + "ESCAPED = list(map(getattr, [torch], ['sys']))[0]  #!\n", "getattr: not allowed"),
    Attack("getattr rebound", "g = getattr  #!\nESCAPED = g\n", "getattr: not allowed"),
    Attack("setattr", T + "setattr(torch, 'allclose', torch.allclose)  #!\nESCAPED = True\n", "setattr: not allowed"),
    Attack("delattr", "class C:\n    x = 1\ndelattr(C, 'x')  #!\nESCAPED = True\n", "delattr: not allowed"),
    Attack("exec", "exec('ESCAPED = 1')  #!\n", "exec: not allowed"),
    Attack("eval", "ESCAPED = eval('1 + 1')  #!\n", "eval: not allowed"),
    Attack("compile", "ESCAPED = compile('1', 'x', 'eval')  #!\n", "compile: not allowed"),
    Attack("open", "ESCAPED = open  #!\n", "open: not allowed"),
    Attack("__import__", "ESCAPED = __import__('os')  #!\n", "__import__: not allowed"),
    Attack("globals", "ESCAPED = globals()['__builtins__']  #!\n", "globals: not allowed"),
    Attack("locals", "ESCAPED = locals()  #!\n", "locals: not allowed"),
    Attack("vars", T + "ESCAPED = vars(torch)['sys']  #!\n", "vars: not allowed"),
    Attack("dir", T + "ESCAPED = dir(torch)  #!\n", "dir: not allowed"),
    Attack("__builtins__", "ESCAPED = __builtins__  #!\n", "__builtins__: not allowed"),
    Attack("breakpoint", "breakpoint()  #!\n", "breakpoint: not allowed", live=False),
    Attack("input", "ESCAPED = input()  #!\n", "input: not allowed", live=False),
    Attack("memoryview", "ESCAPED = memoryview(bytearray(4))  #!\n", "memoryview: not allowed"),
    Attack("a parameter named getattr", "def f(getattr):  #!\n    return getattr\n", "getattr: not allowed",
           live=False),
    Attack("builtins.getattr by attribute", "def f(b):\n    return b.getattr(b, 'x')  #!\n",
           "attribute .getattr: reaches an attribute by a computed name", live=False),
    Attack("x.exec on anything", "def f(b):\n    return b.exec('1')  #!\n", "attribute .exec: runs text as code",
           live=False),
    Attack("operator.attrgetter", T + "import operator\nESCAPED = operator.attrgetter('sys')(torch)  #!\n",
           "operator.attrgetter: reaches attributes named by strings"),
    Attack("from operator import methodcaller", "from operator import methodcaller  #!\n"
           "ESCAPED = methodcaller('bit_length')(1)\n", "from operator import methodcaller: calls methods named"),
    Attack("str.format attribute field", "ESCAPED = '{0.__class__}'.format(1)  #!\n",
           ".format: the field {0.__class__} reads an attribute"),
    Attack("str.format_map attribute field", T + "ESCAPED = '{m.sys}'.format_map({'m': torch})  #!\n",
           ".format_map: the field {m.sys}"),
    Attack("str.format item field", "ESCAPED = '{0[a]}'.format({'a': 1})  #!\n", "the field {0[a]}"),
    Attack("str.format nested field", "ESCAPED = '{0:{1.real}}'.format(1, 2)  #!\n", "the field {1.real}"),
    Attack("str.format unbound", "ESCAPED = str.format('{0.__class__}', 1)  #!\n", ".format: only on a string literal"),
    Attack("str.format on a variable", "fmt = '{0.__class__}'\nESCAPED = fmt.format(1)  #!\n",
           ".format: only on a string literal"),
    Attack("type with three arguments", "ESCAPED = type('X', (), {'__getattr__': lambda s, n: n})  #!\n",
           "type: only type(x).__name__"),
    Attack("type kept as a value", "T = type(1)  #!\nESCAPED = T\n", "type: only type(x).__name__"),
    Attack("type of type called", "ESCAPED = type(type(1))('X', (), {})  #!\n", "type: only type(x).__name__"),
    Attack("isinstance rebound to call a type",
           "isinstance = lambda t: t('X', (), {})  #!\nESCAPED = isinstance(type)\n",
           "isinstance: a built-in the screen relies on"),
    # --- underscore attributes, frames and the like -------------------------------------------------------------
    Attack("__dict__", T + "ESCAPED = torch.__dict__['sys']  #!\n", "attribute __dict__: underscore"),
    Attack("__class__", "ESCAPED = (1).__class__  #!\n", "attribute __class__: underscore"),
    Attack("__globals__", "def f():\n    pass\nESCAPED = f.__globals__  #!\n", "attribute __globals__"),
    Attack("__name__ written", "def f():\n    pass\nf.__name__ = 'g'  #!\nESCAPED = f.__name__ == 'g'\n",
           "attribute __name__: underscore"),
    Attack("super().__getattribute__", "class C:\n    def f(self):\n"
           "        return super().__getattribute__('f')  #!\nESCAPED = C().f()\n", "attribute __getattribute__"),
    Attack("a generator's frame", "def g():\n    yield 1\nESCAPED = g().gi_frame.f_globals['__builtins__']  #!\n",
           "attribute .gi_frame: an interpreter frame attribute"),
    Attack("a coroutine's frame", "async def c():\n    pass\nco = c()\nESCAPED = co.cr_frame  #!\nco.close()\n",
           "attribute .cr_frame"),
    Attack("a frame's caller", "def f(fr):\n    return fr.f_back.f_globals  #!\n", "attribute .f_back", live=False),
    Attack("a traceback's frame", "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
           "    ESCAPED = e.__traceback__.tb_frame  #!\n", "attribute __traceback__"),
    Attack("tb_frame on anything", "def f(tb):\n    return tb.tb_frame  #!\n", "attribute .tb_frame", live=False),
    Attack("AttributeError.obj", "try:\n    (1).nope\nexcept AttributeError as e:\n    ESCAPED = e.obj  #!\n",
           "attribute .obj: an AttributeError's object can be a module", proof="ESCAPED == 1"),
    Attack("x.sys on anything", "def f(x):\n    return x.sys.modules  #!\n", "attribute .sys: names", live=False),
    Attack("x.os on anything", "def f(x):\n    return x.os.system  #!\n", "attribute .os: names", live=False),
    Attack("x.builtins on anything", "def f(x):\n    return x.builtins  #!\n", "attribute .builtins", live=False),
    Attack("x.subprocess on anything", "def f(x):\n    return x.subprocess  #!\n", "attribute .subprocess",
           live=False),
    # --- monkey-patching what the checks beside a candidate use --------------------------------------------------
    Attack("torch.allclose patched", T + "torch.allclose = torch.allclose  #!\nESCAPED = True\n",
           "torch.allclose = ...: a candidate changes no module"),
    Attack("F.log_softmax patched", F + "F.log_softmax = F.log_softmax  #!\nESCAPED = True\n",
           "changes no module"),
    Attack("Tensor.sum patched", T + "torch.Tensor.sum = torch.Tensor.sum  #!\nESCAPED = True\n",
           "torch.Tensor.sum = ...: a candidate changes no module"),
    Attack("an imported class patched", "from torch import Tensor\nTensor.sum = Tensor.sum  #!\nESCAPED = True\n",
           "Tensor.sum = ...: a candidate changes no module"),
    Attack("a module attribute deleted", T + "del torch.nn.functional.gelu  #!\n", "changes no module", live=False),
    Attack("a module container written", "import copy\ncopy.dispatch_table[complex] = None  #!\n",
           "copy.dispatch_table: a mutable container", live=False),
    Attack("a module attribute augmented", "import math\nmath.pi += 0  #!\nESCAPED = True\n", "math.pi = ...: a "),
    # --- classes that change how Python or torch treat objects ---------------------------------------------------
    Attack("tensor subclass", T + "class T(torch.Tensor):  #!\n    pass\nESCAPED = T\n",
           "class T(torch.Tensor): a tensor subclass"),
    Attack("parameter subclass", "from torch import nn\nclass P(nn.Parameter):  #!\n    pass\nESCAPED = P\n",
           "a tensor subclass"),
    Attack("tensor subclass through an alias",
           "from torch import Tensor as B\nclass T(B):  #!\n    pass\nESCAPED = T\n",
           "a tensor subclass"),
    Attack("a base the screen cannot name", T + "def sub(base):\n    class T(base):  #!\n        pass\n    return T\n",
           "a base the screen cannot name", live=False),
    Attack("a torch class kept in a list and patched",
           T + "[torch.Tensor][0].sum = torch.Tensor.sum  #!\nESCAPED = 1\n",
           "torch.Tensor: a class of an allowed module used as a value"),
    Attack("a torch class handed to a patcher", T + "def patch(c):\n    c.sum = c.sum\n"
           "patch(torch.Tensor)  #!\nESCAPED = 1\n", "torch.Tensor: a class of an allowed module used as a value"),
    Attack("a class alias rebound",
           "from torch import nn\nM = nn.Module\nM = [M][0]  #!\nM.eval = M.eval\nESCAPED = 1\n",
           "M: bound to the class Module and here to something else"),
    Attack("a class as a default",
           "from torch import nn\ndef f(c=nn.Module):  #!\n    c.eval = c.eval\nf()\nESCAPED = 1\n",
           "nn.Module: a class of an allowed module used as a value"),
    Attack("__torch_function__",
           "class H:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):  #!\n"
           "        return 1\nESCAPED = H\n", "def __torch_function__: a special method"),
    Attack("__torch_function__ assigned", "class H:\n    __torch_function__ = None  #!\nESCAPED = H\n",
           "__torch_function__: dunder names"),
    Attack("module __getattr__", "def __getattr__(name):  #!\n    return name\nESCAPED = __getattr__\n",
           "def __getattr__: a special method"),
    Attack("__del__", "class D:\n    def __del__(self):  #!\n        pass\nESCAPED = D\n", "def __del__"),
    Attack("__reduce__", "class D:\n    def __reduce__(self):  #!\n        return (print, ())\nESCAPED = D\n",
           "def __reduce__"),
    Attack("an object equal to anything", "class Yes:\n    def __eq__(self, other):  #!\n        return True\n"
           "ESCAPED = Yes() == 0\n", "def __eq__: a special method"),
    Attack("an object true whatever it holds", "class T:\n    def __bool__(self):  #!\n        return True\n"
           "ESCAPED = bool(T())\n", "def __bool__: a special method"),
    Attack("metaclass keyword", "import abc\nclass X(metaclass=abc.ABCMeta):  #!\n    pass\nESCAPED = X\n",
           "a class keyword (metaclass=)"),
    Attack("a metaclass called", "import abc\nESCAPED = abc.ABCMeta('X', (), {'__del__': print})  #!\n",
           "abc.ABCMeta: a metaclass"),
    Attack("enum's metaclass", "import enum\nESCAPED = enum.EnumType  #!\n", "enum.EnumType: a metaclass"),
    Attack("make_dataclass namespace", "import dataclasses\n"
           "ESCAPED = dataclasses.make_dataclass('X', [], namespace={'__del__': print})  #!\n",
           "dataclasses.make_dataclass: builds a class from a namespace of strings"),
    Attack("update_wrapper copies by name", "import functools\nclass C:\n    pass\ndef f():\n    pass\n"
           "functools.update_wrapper(C, f, assigned=('__globals__',), updated=())  #!\nESCAPED = C.__globals__\n",
           "functools.update_wrapper: copies attributes named by strings"),
    Attack("wraps copies by name", "from functools import wraps  #!\nESCAPED = wraps\n",
           "from functools import wraps: copies attributes named by strings"),
    # --- strings evaluated as code ----------------------------------------------------------------------------
    Attack("a string annotation", f"def f(x: \"{ANNOT}\"):  #!\n    pass\n", "globals: not allowed", live=False),
    Attack("a string annotation importing", "def f(x: \"__import__('os')\"):  #!\n    pass\n",
           "__import__: not allowed", live=False),
    Attack("a nested string annotation",
           "import typing\nimport torch\ndef f(x: \"typing.List['torch.sys']\"):  #!\n    pass\n",
           "torch.sys", live=False),
    Attack("a dataclass field's string annotation",
           "import dataclasses\nimport torch\n@dataclasses.dataclass\nclass D:\n"
           "    x: 'torch.sys' = 1  #!\n", "torch.sys", live=False),
    Attack("a string annotation that is not an expression", "def f() -> 'import os':  #!\n    pass\n",
           "not an expression", live=False),
    Attack("typing.get_type_hints",
           "import typing\nS = bytes.fromhex('" + b"__import__('os').getpid".hex() + "').decode()\n"
           "class C:\n    x: typing.List[S]\nESCAPED = typing.get_type_hints(C)  #!\n",
           "typing.get_type_hints: evaluates string annotations as code", proof="'getpid' in repr(ESCAPED)"),
    Attack("from typing import get_type_hints", "from typing import get_type_hints  #!\nESCAPED = get_type_hints\n",
           "from typing import get_type_hints: evaluates"),
    Attack("typing.ForwardRef", "import typing\nESCAPED = typing.ForwardRef('1 + 1')  #!\n",
           "typing.ForwardRef: evaluates a string as code"),
    Attack("typing_extensions.get_annotations", "import typing_extensions\n"
           "ESCAPED = typing_extensions.get_annotations  #!\n", "evaluates string annotations as code"),
    Attack("singledispatch evaluates annotations", "import functools\nESCAPED = False\n@functools.singledispatch  #!\n"
           "def f(x):\n    return x\n@f.register\ndef _(x: \"" + ANNOT + "\"):\n    return x\n",
           "functools.singledispatch: its register() evaluates string annotations", proof="ESCAPED is True"),
    # --- match patterns reaching attributes -------------------------------------------------------------------
    Attack("match class pattern on a frame attribute", "def g():\n    yield 1\nmatch g():\n"
           "    case object(gi_frame=fr):  #!\n        ESCAPED = fr\n", "case ...(gi_frame=...)"),
    Attack("match class pattern on a dunder", "match 1:\n    case object(__class__=c):  #!\n        ESCAPED = c\n",
           "case ...(__class__=...): underscore"),
    Attack("match value pattern through torch", T + "match 1:\n    case torch.sys.maxsize:  #!\n        pass\n",
           "torch.sys: is the module sys", live=False),
    # --- state ------------------------------------------------------------------------------------------------
    Attack("global", "X = 1\ndef f():\n    global X  #!\n    X = 2\n", "global X: a candidate keeps no module state",
           live=False),
    Attack("a decorator from torch.jit", T + "@torch.jit.script  #!\ndef f(x):\n    return x\n", "torch.jit:",
           live=False),
]


# --- payloads in every syntactic place: the screen reads the whole tree, not a few statement forms -------------

PAYLOAD_PRELUDE = "import torch\nimport operator\nimport torch.nn.functional as F\nx = 1\n"
PAYLOADS = {
    "torch.sys": "torch.sys", "torch.builtins.exec": "torch.builtins.exec", "getattr": "getattr(x, 'y')",
    "attrgetter": "operator.attrgetter('sys')", "gi_frame": "x.gi_frame", "format field": "'{0.__class__}'.format(x)",
    "module value": "[torch]", "type three arguments": "type('X', (), {})", "__dict__": "x.__dict__",
    "F.importlib": "F.importlib", "F.np": "F.np", "torch.set_default_dtype": "torch.set_default_dtype",
}
CONTEXTS = {
    "assignment": "y = {P}",
    "function body": "def f():\n    return {P}",
    "nested function": "def f():\n    def g():\n        return {P}\n    return g",
    "lambda": "f = lambda: {P}",
    "default argument": "def f(a={P}):\n    pass",
    "keyword-only default": "def f(*, a={P}):\n    pass",
    "decorator": "@{P}\ndef f():\n    pass",
    "class body": "class C:\n    y = {P}",
    "method": "class C:\n    def m(self):\n        return {P}",
    "class base": "class C({P}):\n    pass",
    "list comprehension": "ys = [{P} for _ in range(1)]",
    "comprehension condition": "ys = [i for i in range(1) if {P}]",
    "dict comprehension": "ys = {{k: {P} for k in range(1)}}",
    "generator expression": "ys = list({P} for _ in range(1))",
    "f-string": "y = f\"{{{P}}}\"",
    "string annotation": "def f(a: \"{P}\"):\n    pass",
    "return annotation": "def f() -> \"{P}\":\n    pass",
    "annotated assignment": "y: int = {P}",
    "call argument": "y = print({P})",
    "keyword argument": "y = print(k={P})",
    "with item": "with {P} as z:\n    pass",
    "except body": "try:\n    pass\nexcept Exception:\n    y = {P}",
    "except type": "try:\n    pass\nexcept {P}:\n    pass",
    "conditional expression": "y = 1 if x else {P}",
    "if test": "if {P}:\n    pass",
    "while body": "while x:\n    y = {P}\n    break",
    "for iterable": "for i in {P}:\n    pass",
    "walrus": "y = (z := {P})",
    "await": "async def f():\n    await {P}",
    "async for": "async def f():\n    async for i in {P}:\n        pass",
    "yield": "def g():\n    yield {P}",
    "yield from": "def g():\n    yield from {P}",
    "assert": "assert {P}",
    "raise": "raise ValueError({P})",
    "subscript": "y = [1][{P}]",
    "slice": "y = [1][{P}:]",
    "starred": "y = [*{P}]",
    "dict display": "y = {{'k': {P}}}",
    "match subject": "match {P}:\n    case _:\n        pass",
    "match guard": "match x:\n    case 1 if {P}:\n        pass",
    "delete target": "del {P}[0]",
    "augmented assignment": "y = 0\ny += {P}",
    "boolean operation": "y = x and {P}",
    "comparison": "y = x == {P}",
    "unary": "y = not {P}",
    "lambda default": "f = lambda a={P}: a",
    "global scope after main guard": "if __name__ == '__main__':\n    y = {P}",
}


# --- honest candidates ----------------------------------------------------------------------------------------

HONEST_LOSS = '''"""A clipped policy-gradient loss with token masks, the way a researcher writes one."""

from __future__ import annotations

import abc
import copy
import functools
import itertools
import math
import numbers
import operator
import typing
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Config", "clipped_loss", "describe", "ValueHead"]


class Reduction(Enum):
    TOKEN = "token"
    SEQUENCE = "sequence"


@dataclass
class Config:
    eps: float = 0.2
    beta: float = 0.04
    kl: float = 0.0
    gamma: float = 1.0
    reduction: Reduction = Reduction.TOKEN
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.eps < 1:
            raise ValueError(f"Config: eps must be in [0, 1), got {self.eps!r}")


class Stats(NamedTuple):
    ratio_min: float
    ratio_max: float


class Baseline(abc.ABC):
    @abc.abstractmethod
    def __call__(self, rewards: torch.Tensor) -> torch.Tensor: ...


class GroupMean(Baseline):
    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards.mean(-1, keepdim=True)


class ValueHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h).squeeze(-1)


TensorOrFloat = typing.Union[torch.Tensor, float]


def _check(x: "torch.Tensor", name: str) -> torch.Tensor:
    if not isinstance(x, (torch.Tensor, float)):
        raise TypeError("{}: must be a tensor, got {}".format(name, type(x).__name__))
    if type(x) is not torch.Tensor and not x.is_floating_point():
        raise TypeError(f"{name}: {type(x).__qualname__} is not floating point")
    return x


@torch.no_grad()
def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = F.log_softmax(logits.double() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1)


@functools.lru_cache(maxsize=8)
def horizon_weights(T: int) -> tuple:
    return tuple(1.0 / math.sqrt(t) for t in range(1, T + 1))


def batches(xs: Sequence[int], n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


def clipped_loss(logp, old_logp, adv, mask, cfg: Optional[Config] = None):
    cfg = cfg or Config()
    _check(logp, "clipped_loss")
    if not isinstance(cfg.eps, numbers.Real):
        raise TypeError("clipped_loss: eps must be a number")
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.eps, 1 + cfg.eps) * a)
    loss = -masked_mean(surrogate, mask)
    positions = torch.cumsum(mask.long(), dim=-1)
    weights = torch.where(mask, positions.clamp_min(1).double().rsqrt(), torch.zeros_like(ratio, dtype=torch.float64))
    log_r = old_logp - logp
    kl = masked_mean(log_r.exp() - log_r - 1, mask)
    entropy = torch.distributions.Categorical(logits=torch.stack([logp, old_logp], -1)).entropy()
    total = loss + cfg.beta * kl + 0.0 * entropy.sum()
    valid = ratio[mask]
    stats = Stats(float(valid.min()), float(valid.max()))
    per_group = defaultdict(list)
    for i, g in enumerate(itertools.chain.from_iterable(batches(list(range(adv.shape[0])), 2))):
        per_group[g % 2].append(i)
    metrics = OrderedDict(loss=float(loss), kl=float(kl), ratio_min=stats.ratio_min, ratio_max=stats.ratio_max)
    out = metrics.copy()
    out["weights_sum"] = float(weights.sum().cpu())
    out["norm"] = float(torch.linalg.vector_norm(weights.type(torch.float32)))
    out["sigmoid"] = float(torch.special.expit(valid).mean())
    out["groups"] = len(per_group)
    out["cells"] = functools.reduce(operator.mul, logp.shape, 1)
    out["first"] = float(logp.select(0, 0).sum())
    out["h"] = sum(horizon_weights(3))
    out["finite"] = all(math.isfinite(v) for v in metrics.values())
    out["pretty"] = "{:.3f} {!r}".format(float(loss), cfg.reduction.value) + " %s" % (stats,)
    return total, out


def describe(r) -> str:
    match r:
        case Reduction.TOKEN:
            return "token"
        case Config(eps=e, beta=b):
            return f"eps {e} beta {b}"
        case [first, *rest]:
            return f"{first} and {len(rest)} more"
        case {"kind": kind}:
            return str(kind)
        case _:
            return "other"


def grad_of_loss(logp: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        x = logp.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(F.softplus(x).sum(), x)
    with torch.set_grad_enabled(False):
        return g.clone()


def frozen(policy: nn.Module) -> nn.Module:
    snap = copy.deepcopy(policy).eval()
    for p in snap.parameters():
        p.requires_grad_(False)
    return snap


def sampled(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    try:
        return torch.rand(n, generator=g)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"sampled: {exc}") from None


if __name__ == "__main__":
    print(describe(Config()))
'''

# Exercised by tests/test_screen.py, in a plain Python, so the honest corpus is code that runs, not only parses.
HONEST_LOSS_RUN = """
torch.manual_seed(0)
logp = torch.randn(4, 5, dtype=torch.float64) * 0.1 - 1
old = logp + torch.randn(4, 5, dtype=torch.float64) * 0.05
mask = torch.rand(4, 5) > 0.2
mask[:, 0] = True
total, out = clipped_loss(logp, old, torch.randn(4, dtype=torch.float64), mask)
assert torch.isfinite(total) and out["finite"] and out["groups"] == 2, out
assert describe(Config()) == "eps 0.2 beta 0.04" and describe(Reduction.TOKEN) == "token"
assert describe([1, 2, 3]) == "1 and 2 more" and describe({"kind": "k"}) == "k"
assert ValueHead(3)(torch.zeros(2, 3)).shape == (2,)
assert GroupMean()(torch.ones(2, 3)).shape == (2, 1)
assert grad_of_loss(logp).shape == logp.shape and frozen(ValueHead(2)).training is False
assert sampled(3).shape == (3,)
assert token_logprobs(torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long)).shape == (1, 2)
HONEST_OK = True
"""
