/* dlsym, interposed (x86-64 System V). glibc's dlsym is caller-sensitive: RTLD_NEXT means "after
   the object that called dlsym", found from its return address. So this entry asks
   vcudnn_dlsym_decide(handle, name, caller) whether to answer itself (an entry point of libcuda that
   vcudnn hooks: interpose/entry_point_hooks.cpp) and otherwise jumps to the real dlsym with the
   caller's arguments and return address untouched, as if it had been called directly. */
    .text
    .globl  dlsym
    .type   dlsym, @function
dlsym:
    .cfi_startproc
    pushq   %rdi
    .cfi_adjust_cfa_offset 8
    pushq   %rsi
    .cfi_adjust_cfa_offset 8
    subq    $8, %rsp                     /* the call below needs a 16-byte aligned stack */
    .cfi_adjust_cfa_offset 8
    movq    24(%rsp), %rdx               /* the caller's return address */
    call    vcudnn_dlsym_decide
    addq    $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq    %rsi
    .cfi_adjust_cfa_offset -8
    popq    %rdi
    .cfi_adjust_cfa_offset -8
    testq   %rax, %rax
    jz      1f
    ret                                  /* vcudnn's answer */
1:
    jmp     *vcudnn_dlsym_next(%rip)     /* the real dlsym, for the caller */
    .cfi_endproc
    .size   dlsym, .-dlsym

    .section .note.GNU-stack, "", @progbits
