// The npm clients the serve tests import, resolved from this directory's node_modules (tests/serve/tools_cases.mjs).
export { default as OpenAI } from "openai";
export { default as Ajv2020 } from "ajv/dist/2020.js";
export { default as addFormats } from "ajv-formats";
export { z } from "zod";
export { generateText, generateObject, tool } from "ai";
export { createOpenAICompatible } from "@ai-sdk/openai-compatible";
export { ChatOpenAI } from "@langchain/openai";
