//! A compile bomb (issue 58): one function whose optimised compile costs the compiler far more
//! than its size says, for the tests of the compile budget. 6,400 `i64` locals, each changed
//! inside 1,280 nested loops that all branch back, and all summed after: every local is live
//! across every loop header, so Cranelift's SSA form gives each header 6,400 block parameters
//! (8.2 million in all) and its register allocator tracks them all. About 64 KB of code;
//! Winch, single-pass, compiles it in milliseconds. Made with `wasm-encoder`, the encoder
//! wasmtime's own tests use.

use wasm_encoder::{
    BlockType, CodeSection, ComponentSection, Encode, Function, FunctionSection, Instruction as I, Module,
    ModuleSection, TypeSection, ValType,
};

const LOCALS: u32 = 6_400;
const LOOPS: u32 = 1_280;

/// The bomb as a core module.
pub fn module() -> Module {
    let mut types = TypeSection::new();
    types.ty().function([], [ValType::I64]);
    let mut functions = FunctionSection::new();
    functions.function(0);
    let mut f = Function::new([(LOCALS, ValType::I64)]);
    for _ in 0..LOOPS {
        f.instruction(&I::Loop(BlockType::Empty));
    }
    for i in 0..LOCALS {
        f.instruction(&I::LocalGet(i))
            .instruction(&I::I64Const(1))
            .instruction(&I::I64Add)
            .instruction(&I::LocalSet(i));
    }
    for depth in 0..LOOPS {
        // Branch back while local 0 is small: a real loop, so nothing is folded away.
        f.instruction(&I::LocalGet(0))
            .instruction(&I::I64Const(i64::from(depth) + 2))
            .instruction(&I::I64LtU)
            .instruction(&I::BrIf(0))
            .instruction(&I::End);
    }
    f.instruction(&I::LocalGet(0));
    for i in 1..LOCALS {
        f.instruction(&I::LocalGet(i)).instruction(&I::I64Add);
    }
    f.instruction(&I::End);
    let mut code = CodeSection::new();
    code.function(&f);
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&code);
    module
}

/// `component` with the bomb appended as one more core module, which nothing instantiates: the
/// component works as before, and every compile of it compiles the bomb too.
pub fn armed(mut component: Vec<u8>) -> Vec<u8> {
    let module = module();
    let section = ModuleSection(&module);
    component.push(section.id());
    section.encode(&mut component);
    component
}
